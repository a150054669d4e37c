"""`tfdet run`: pin what must be set before Python and TensorFlow start."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

from absl import app

from tfdet import _enable, _isa


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="Run a script or module with every determinism setting pinned.",
        description="Sets PYTHONHASHSEED, ONEDNN_MAX_CPU_ISA, thread counts, "
        "TF_DETERMINISTIC_OPS and XLA_FLAGS before the interpreter starts, "
        "calls tfdet.enable() with the same settings, then runs the script as "
        "__main__. Usage: tfdet run [flags] script.py [args] | tfdet run "
        "[flags] -m module [args] | tfdet run [flags] -- python script.py [args]. "
        "The script's exit status is passed through.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed (default 0).")
    parser.add_argument(
        "--threads", type=int, default=1, help="Intra/inter-op threads (default 1)."
    )
    parser.add_argument(
        "--cpu-isa",
        default="AVX2",
        help=f"oneDNN ISA cap on x86-64, one of {', '.join(_isa.NAMES)} "
        "(default AVX2).",
    )
    onednn = parser.add_mutually_exclusive_group()
    onednn.add_argument(
        "--onednn",
        dest="onednn",
        action="store_true",
        default=None,
        help="Require TensorFlow's oneDNN custom ops on.",
    )
    onednn.add_argument(
        "--no-onednn",
        dest="onednn",
        action="store_false",
        help="Require oneDNN custom ops off (slower, different bits).",
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
    parser.set_defaults(func=execute)


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
    if rest and os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]  # `tfdet run -- python train.py`: we pick the interpreter.
        if rest[:1] == ["-m"] and len(rest) > 1:
            return "module", rest[1], rest[2:]
    if not rest:
        raise app.UsageError(
            "Expected a script to run: `tfdet run script.py [args]` or "
            "`tfdet run -m module [args]`."
        )
    return "script", rest[0], rest[1:]


def execute(args: argparse.Namespace) -> int:
    kind, target, arguments = _split_command(args)
    if kind == "script" and not os.path.isfile(target):
        raise app.UsageError(f"Expected a Python script. No such file: {target!r}")
    if kind == "module" and importlib.util.find_spec(target.split(".")[0]) is None:
        raise app.UsageError(f"Expected an importable module. Not found: {target!r}")
    try:  # Validate here, so that bad flags fail before anything starts.
        cpu_isa = _enable.check_isa_supported(args.cpu_isa or None)
        _enable._check_int("seed", args.seed, 0, _enable.MAX_SEED)
        _enable._check_int("threads", args.threads, 1, None)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
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
    command = [
        sys.executable,
        "-m",
        "tfdet._launch",
        json.dumps(settings),
        kind,
        target,
    ]
    completed = subprocess.run([*command, *arguments], env=env, check=False)
    # A child killed by signal N reports -N; shells report 128 + N.
    return (
        completed.returncode
        if completed.returncode >= 0
        else 128 - completed.returncode
    )
