"""The `tfdet` command line: one module per subcommand in this package.

Each subcommand module defines `add_parser(subparsers)`, which registers its
flags and `set_defaults(func=execute)`, and `execute(args) -> int`. Library
exceptions become exit codes here, in one place (see `tfdet._errors`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from absl import app
from absl.flags import argparse_flags

from tfdet._errors import EXIT_USAGE, Error

# Subcommand modules, in the order `tfdet --help` lists them.
SUBCOMMANDS = ("check", "run", "env", "diff", "locate", "scan")


def _available_subcommands() -> list[str]:
    here = os.path.dirname(__file__)
    return [
        name for name in SUBCOMMANDS if os.path.exists(os.path.join(here, f"{name}.py"))
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


def execute(args: argparse.Namespace) -> int:
    """Runs a parsed command and maps tfdet exceptions to exit codes."""
    try:
        return int(args.func(args))
    except Error as error:
        _report_error(error)
        return error.exit_code
    except app.UsageError as error:
        _report_error(error)
        return EXIT_USAGE


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
