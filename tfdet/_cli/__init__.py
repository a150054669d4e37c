"""The `tfdet` command line: one module per subcommand in this package.

Each subcommand module defines `add_parser(subparsers)`, which registers its
flags and `set_defaults(func=execute)`, and `execute(args) -> int`. Library
exceptions become exit codes here, in one place (see `tfdet._errors`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from absl import app
from absl.flags import argparse_flags

from tfdet._errors import EXIT_RUN_FAILED, EXIT_USAGE, Error

# Subcommand modules, in the order `tfdet --help` lists them.
SUBCOMMANDS = ("check", "run", "env", "diff", "locate", "scan")


def _available_subcommands() -> list[str]:
    return [
        name
        for name in SUBCOMMANDS
        if importlib.util.find_spec(f"tfdet._cli.{name}") is not None
    ]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse_flags.ArgumentParser(
        prog="tfdet",
        description="Bit-for-bit reproducible Keras/TensorFlow training, and the proof.",
        epilog="Exit codes: 0 bit-identical / nothing found, 1 divergence or "
        "hazards found, 2 usage or bad input, 3 a run failed or timed out, "
        "4 a requested device is not available.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _available_subcommands():
        importlib.import_module(f"tfdet._cli.{name}").add_parser(subparsers)
    return parser


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """Parses `argv` (program name first); exits 2 on usage errors."""
    return build_parser().parse_args(list(argv[1:]))


def _report_error(error: BaseException) -> None:
    print(f"tfdet: error: {error}", file=sys.stderr)


def _check_json_destination(path: str | None) -> None:
    """Fails before any work when `--json FILE` cannot be written."""
    if not path:
        return
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:  # Leave no empty report behind if the command fails.
            os.remove(path)
    except OSError as error:
        raise app.UsageError(
            f"Expected --json to name a writable file. Received: {path!r} ({error})"
        ) from error


def write_json(path: str | None, data: Any) -> None:
    """Writes a subcommand's `--json` report (nothing when `path` is None)."""
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)


def execute(args: argparse.Namespace) -> int:
    """Runs a parsed command and maps exceptions to exit codes.

    tfdet errors carry their own code; usage errors are 2; an interrupt is
    130; any other exception is a bug in tfdet or beneath it, reported with
    its traceback as exit 3, never as 0 ("equal") or 1 ("diverged").
    """
    try:
        _check_json_destination(getattr(args, "json", None))
        return int(args.func(args))
    except Error as error:
        _report_error(error)
        return error.exit_code
    except app.UsageError as error:
        _report_error(error)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tfdet: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the last line of defence
        traceback.print_exc()
        print(
            f"tfdet: internal error: {error!r}. No verdict was reached (exit "
            f"{EXIT_RUN_FAILED}); please report this with the traceback above.",
            file=sys.stderr,
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


def _app_main(args: argparse.Namespace) -> int:
    return execute(args)


def run_main() -> None:
    """Console-script entry point (`tfdet`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # absl's handler shows INFO; tfdet's own progress is in the report.
    logging.getLogger("tfdet").setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(_app_main, flags_parser=parse_flags)
