"""Run a script or module with every determinism setting pinned.

Sets PYTHONHASHSEED, ONEDNN_MAX_CPU_ISA, thread counts, TF_DETERMINISTIC_OPS
and XLA_FLAGS before the interpreter starts, calls tfdet.enable() with the
same settings, then runs the script as __main__.

Forms: tfdet run [flags] script.py [args]
       tfdet run [flags] -m module [args]
       tfdet run [flags] -- python script.py [args]

Exit codes: the script's own exit status, as a shell reports it (128 + N when
it was stopped by signal N); 2 bad flags or no script to run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading

from absl import app

from tfdet import _variables
from tfdet._cli import _training_flags, usage_errors
from tfdet._pin import _isa, _settings
from tfdet._setup import _enable
from tfdet._target import _load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _training_flags.add_seed_and_threads(parser)
    parser.add_argument(
        "--cpu-isa",
        default=_settings.DEFAULT_CPU_ISA,
        help=f"oneDNN ISA cap on x86-64, one of {', '.join(_isa.NAMES)}, or "
        "none for no cap (default AVX2).",
    )
    onednn = parser.add_mutually_exclusive_group()
    onednn.add_argument(
        "--onednn",
        dest="onednn",
        action="store_true",
        default=_settings.DEFAULT_ONEDNN,
        help="Require TensorFlow's oneDNN custom ops on (the default on x86-64).",
    )
    onednn.add_argument(
        "--no-onednn",
        dest="onednn",
        action="store_false",
        help="Require oneDNN custom ops off (the default on aarch64, where "
        "oneDNN's kernels follow the SVE vector length; other bits).",
    )
    # Like `python -m`: everything after the module name is the module's own
    # (`tfdet run -m pkg --help` must reach pkg, not print tfdet's help).
    parser.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        help="Run a module as __main__, like python -m; the rest are its arguments.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args]")


# `python`, `python3`, `python3.11`, `python.exe`; not `python_utils.py`.
_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?", re.IGNORECASE)


def _is_interpreter(word: str) -> bool:
    return bool(_INTERPRETER.fullmatch(os.path.basename(word)))


def _split_command(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """Returns (kind, target, arguments) from the flags and the remainder."""
    if args.module is not None:
        if not args.module:
            raise app.UsageError(
                "Expected a module after -m: `tfdet run -m module [args]`."
            )
        return "module", args.module[0], list(args.module[1:])
    rest = list(args.command)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest and _is_interpreter(rest[0]):
        rest = rest[1:]  # `tfdet run -- python train.py`: we pick the interpreter.
        if rest[:1] == ["-m"]:
            if len(rest) < 2:
                raise app.UsageError("Expected a module after -m: `python -m module`.")
            return "module", rest[1], rest[2:]
    if not rest:
        raise app.UsageError(
            "Expected a script to run: `tfdet run script.py [args]` or "
            "`tfdet run -m module [args]`."
        )
    if rest[0].startswith("-"):
        # `python -c code`, `python -u ...`: interpreter options are not ours
        # to pass; tfdet picks the interpreter and its settings.
        raise app.UsageError(
            "Expected a script or `-m module` after the interpreter. Received "
            f"the interpreter option {rest[0]!r}: put the code in a script, or "
            "set it in PYTHON* environment variables."
        )
    return "script", rest[0], rest[1:]


def _module_exists(name: str) -> bool:
    """Whether `python -m name` would find the module, without importing it.

    The child runs as `python -m`, which puts the working directory first on
    sys.path; the `tfdet` console script does not, so look there too. A
    dotted name is followed through each package's directories on disk,
    without running any package's `__init__` (that is the script's to run).
    """
    top, *rest = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if spec is None:
        spec = importlib.util.find_spec(top)
    for part in rest:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec is not None


# Seconds a child gets to exit after tfdet forwarded SIGTERM or SIGHUP to it,
# before it is killed: tfdet never exits with its child still running.
STOP_GRACE_SECONDS = 10.0


def _run_child(command: list[str], env: dict[str, str]) -> int:
    """Runs the child and returns its exit status as a shell reports it.

    Ctrl-C is the child's to handle: the terminal sends SIGINT to both
    processes, the child's script decides what it means (and its exit status
    is passed through), and this process only waits for it. SIGTERM and
    SIGHUP, which `kill` and `timeout` send to this process alone, are
    forwarded to the child, which is killed if it has not exited
    `STOP_GRACE_SECONDS` later; the exit status is then 128 + the signal.
    Handlers rather than SIG_IGN: ignored signals would stay ignored in the
    child across exec, handlers are reset.
    """
    process = subprocess.Popen(command, env=env)
    if threading.current_thread() is not threading.main_thread():
        return _shell_status(process.wait())
    received: list[int] = []
    killer = threading.Timer(STOP_GRACE_SECONDS, process.kill)
    killer.daemon = True

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            return
        if not received:
            received.append(signum)
            killer.start()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, on_signal) for signum in stops}
    try:
        returncode = process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        killer.cancel()
        if process.poll() is None:  # Only if wait() itself failed.
            process.kill()
            process.wait()
    return 128 + received[0] if received else _shell_status(returncode)


def _shell_status(returncode: int) -> int:
    # A child killed by signal N reports -N; shells report 128 + N.
    return returncode if returncode >= 0 else 128 - returncode


def execute(args: argparse.Namespace) -> int:
    kind, target, arguments = _split_command(args)
    if kind == "script" and not os.path.isfile(target):
        raise app.UsageError(f"Expected a Python script. No such file: {target!r}")
    if kind == "module" and not _module_exists(target):
        raise app.UsageError(f"Expected an importable module. Not found: {target!r}")
    requested_isa = args.cpu_isa.strip()
    with usage_errors():  # Validate here: bad flags fail before anything starts.
        _, _, cpu_isa = _settings.check_settings(
            args.seed,
            args.threads,
            None if requested_isa.lower() in ("", "none") else requested_isa,
        )
    settings = {
        "seed": args.seed,
        "threads": args.threads,
        "cpu_isa": cpu_isa,
        "onednn": args.onednn,
    }
    env = dict(os.environ)
    env.update(
        _enable.pinned_environment(
            args.seed,
            args.threads,
            cpu_isa if _isa.applies() else None,
            args.onednn,
        )
    )
    if kind == "script" and _load.sets_legacy_keras(target):
        # The script chooses tf_keras itself (`os.environ[...] = "1"` before
        # importing TensorFlow), too late in a process where enable() has
        # imported Keras 3 already: the child starts with it, as each run of
        # `check --script` does, so it trains the Keras the check verified.
        env[_load.LEGACY_KERAS] = "1"
    if getattr(args, "verbose", False):
        env[_variables.VERBOSE] = "1"
    command = [
        sys.executable,
        "-m",
        "tfdet._setup._launch",
        json.dumps(settings),
        kind,
        target,
    ]
    return _run_child([*command, *arguments], env)
