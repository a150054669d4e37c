"""The `tfdet` command line: one module per subcommand in this package.

Each subcommand module is its own `--help`: its docstring's first paragraph is
the one-line help in `tfdet --help`, the rest (ending with what its exit codes
mean) its description; `add_arguments(parser)` adds its flags (flags only
parse: the library validates); `execute(args) -> int` runs it. Library
exceptions become exit codes here, in one place (see `tfdet._errors`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import importlib
import json
import logging
import os
import re
import signal
import stat
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from absl import app
from absl.flags import argparse_flags

from tfdet import _notices
from tfdet._cli import _output
from tfdet._errors import EXIT_RUN_FAILED, EXIT_USAGE, Error, ReportWriteError
from tfdet._version import __version__

# Subcommand modules, in the order `tfdet --help` lists them.
SUBCOMMANDS = ("check", "cost", "run", "env", "diff", "locate", "scan")

# The signals that end tfdet, each with the shell's exit code 128 + N; every
# process tfdet started is killed first.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised in the main thread like Ctrl-C's KeyboardInterrupt.

    A KeyboardInterrupt subclass, so that every `finally` and `except
    KeyboardInterrupt` that cleans up after Ctrl-C (killing the runs' process
    groups) also runs on SIGTERM and SIGHUP.

    Attributes:
        signum: The signal received.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


_received: list[int] = []


def _on_signal(signum: int, frame: Any) -> None:
    if _received:  # Already stopping: a second signal must not cut cleanup short.
        return
    _received.append(signum)
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """Makes SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse_flags.ArgumentParser(
        prog="tfdet",
        description="Bit-for-bit reproducible Keras/TensorFlow training, and the proof.",
        epilog="Exit codes: 0 bit-identical / nothing found, 1 divergence or "
        "hazards found, 2 usage or bad input, 3 a run failed or timed out, "
        "4 a requested device is not available, 128 + N when stopped by signal N "
        "(130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.add_argument("--version", action="version", version=f"tfdet {__version__}")
    # Not -v: absl takes it (--verbosity).
    parser.add_argument("--verbose", **_VERBOSE)
    for name in SUBCOMMANDS:
        _add_subcommand(subparsers, name)
    return parser


def _add_subcommand(subparsers: argparse._SubParsersAction, name: str) -> None:
    """Registers `tfdet NAME` from the module `tfdet._cli.NAME`."""
    module = importlib.import_module(f"tfdet._cli.{name}")
    summary, _, description = (module.__doc__ or "").partition("\n\n")
    parser = subparsers.add_parser(
        name,
        help=" ".join(summary.split()),
        description=description.strip(),
        # Descriptions and epilogs hold lists (usage lines, built-in targets).
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    # Also after the subcommand (`tfdet env --verbose`); SUPPRESS keeps a flag
    # given before it.
    parser.add_argument("--verbose", **{**_VERBOSE, "default": argparse.SUPPRESS})
    parser.set_defaults(func=module.execute)


_VERBOSE: dict[str, Any] = {
    "action": "store_true",
    "default": False,
    "help": "Also show TensorFlow's C++ start-up notices (absl, oneDNN, CUDA "
    "plugin registration), hidden by default.",
}


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """Parses `argv` (program name first); exits 2 on usage errors.

    `args.after_dashes` keeps what followed a `--` (None without one):
    argparse hands its first word to a positional, and `check --script`
    must tell a script's arguments from a TARGET.
    """
    words = list(argv[1:])
    args = build_parser().parse_args(words)
    args.after_dashes = words[words.index("--") + 1 :] if "--" in words else None
    return args


# An option as the library's messages name it: `runs`, `emulate_cpu`,
# `enable=False`, `device=cpu`.
_OPTION = re.compile(r"`([a-z][a-z_]*)(?:=([^`]*))?`")


def as_flags(message: str) -> str:
    """`message` with each option named as its flag: the CLI's spelling.

    The library names options the Python way, for `tfdet.check(runs=1)` and
    `RunOptions`; this turns `` `runs` `` into `--runs`, `` `emulate_cpu` ``
    into `--emulate-cpu`, `` `enable=False` `` into `--no-enable` and
    `` `device=cpu` `` into `--device cpu`. Other backticked words are kept.
    """
    # Imported here: only an error message needs the options' field names.
    from tfdet._commands._options import RunOptions
    from tfdet._commands._script_check import ScriptOptions

    names = {
        field.name
        for options in (RunOptions, ScriptOptions)
        for field in dataclasses.fields(options)
    } - {"target", "args", "run"}  # Not flags: TARGET and the script's arguments.

    def flag(match: re.Match[str]) -> str:
        name, value = match.groups()
        if name not in names:
            return match.group(0)
        dashed = name.replace("_", "-")
        if value == "False":
            return f"--no-{dashed}"
        if value is None or value == "True":
            return f"--{dashed}"
        return f"--{dashed} {value.strip(chr(39))}"

    return _OPTION.sub(flag, message)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Turns the library's `ValueError` about an option into a usage error (exit 2).

    A tfdet error that is also a ValueError (`TargetError`) keeps its own
    exit code.
    """
    try:
        yield
    except ValueError as error:
        if isinstance(error, app.UsageError) or hasattr(error, "exit_code"):
            raise
        raise app.UsageError(str(error)) from error


def _report_error(error: BaseException) -> None:
    _output.err(f"tfdet: error: {as_flags(str(error))}")


def check_output_file(path: str | None, flag: str = "--json") -> None:
    """Fails before any work when an output file (`--json FILE`) cannot be written.

    A directory, a missing or unwritable parent directory, or a file that
    cannot be opened for writing is a usage error (exit 2) here, so that no
    check or measurement runs for a report it could not write.
    """
    if not path or path == "-":
        return
    if os.path.isdir(path):
        raise app.UsageError(
            f"Expected {flag} to name a file. Received: {path!r}, a directory; "
            f"name a file in it, e.g. {os.path.join(path, 'report.json')!r}."
        )
    existed = os.path.exists(path)
    try:
        if existed and not _regular_or_new(path):
            # A FIFO or a device: opening it to try would block on a FIFO
            # without a reader, or hand a reader an end of file.
            if not os.access(path, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable")
            return
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:  # Leave no empty report behind if the command fails.
            os.remove(path)
    except OSError as error:
        raise app.UsageError(
            f"Expected {flag} to name a writable file. Received: {path!r} ({error})"
        ) from error


def write_json(path: str | None, data: Any) -> None:
    """Writes a subcommand's `--json` report (nothing when `path` is None).

    `-` writes it to stdout (and `execute` sends the human report to
    stderr, so stdout parses as JSON). A dict report gets `tfdet_version`, so that a
    report says which tfdet produced it.
    """
    if not path:
        return
    if isinstance(data, dict):
        data = {**data, "tfdet_version": __version__}
    text = json.dumps(data, indent=2, sort_keys=True)
    if path == "-":
        _output.json_out(text)
        return
    try:
        if _regular_or_new(path):
            # Whole or not at all: a full disk leaves no half report.
            partial = f"{path}.tmp"
            try:
                with open(partial, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(partial, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(partial)
        else:  # A pipe or a device: written once, as it is.
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
    except OSError as error:
        raise ReportWriteError(
            f"Expected to write the report to {path!r}. Received: {error}. The "
            "work itself finished, but its report was not written, so no "
            "verdict is given."
        ) from error


def _regular_or_new(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True


def execute(args: argparse.Namespace) -> int:
    """Runs a parsed command and maps exceptions to exit codes.

    tfdet errors carry their own code; usage errors are 2; an interrupt is
    128 + the signal's number (130 for Ctrl-C); any other exception is a bug in tfdet or beneath it, reported with
    its traceback as exit 3, never as 0 ("equal") or 1 ("diverged").
    """
    if not getattr(args, "verbose", False):
        _notices.hide_at_import()
    try:
        check_output_file(getattr(args, "json", None))
        if getattr(args, "json", None) == "-":
            _output.reserve_stdout_for_json()
        return int(args.func(args))
    except Error as error:
        _report_error(error)
        return error.exit_code
    except app.UsageError as error:
        _report_error(error)
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        signum = getattr(interrupt, "signum", signal.SIGINT)
        # Not through sys.stderr: a runs' reader thread may hold its lock,
        # blocked on a pipe nobody reads.
        _output.last_words(
            f"tfdet: interrupted by {signal.Signals(signum).name}; every process "
            "tfdet started was stopped"
        )
        return 128 + signum
    except Exception as error:  # noqa: BLE001 - the last line of defence
        _output.err(traceback.format_exc().rstrip("\n"))
        _output.err(
            f"tfdet: internal error: {error!r}. No verdict was reached (exit "
            f"{EXIT_RUN_FAILED}); please report this with the traceback above."
        )
        return EXIT_RUN_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point callable from tests: returns the exit code.

    Args:
        argv: Arguments including the program name; `sys.argv` when None.
    """
    argv = sys.argv if argv is None else argv
    try:
        args = parse_flags(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2).
        return int(exit_.code or 0)
    return execute(args)


def run_main() -> None:
    """Console-script entry point (`tfdet`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # absl's handler shows INFO; tfdet's own progress is in the report.
    logging.getLogger("tfdet").setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    install_signal_handlers()
    try:
        app.run(execute, flags_parser=parse_flags)
        code: Any = 0
    except SystemExit as exit_:
        code = exit_.code
    except KeyboardInterrupt as interrupt:  # Outside `execute`: while parsing.
        code = 128 + getattr(interrupt, "signum", signal.SIGINT)
    if _received:
        # The runs' reader threads may be blocked writing to a pipe nobody
        # reads, holding the streams' locks: the interpreter's own flush at
        # exit would wait for them forever. Every child is already dead.
        os._exit(code if isinstance(code, int) else EXIT_RUN_FAILED)
    _output.flush_at_exit()  # A reader that went away is not an error.
    sys.exit(code)
