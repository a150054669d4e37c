"""Flags shared by the subcommands that train TARGET in fresh processes.

`tfdet check` and `tfdet locate` start runs the same way (`tfdet._runs._spawn`,
`tfdet._runs._perturb`), so they take the same TARGET and run flags.
"""

from __future__ import annotations

import argparse

from tfdet._cli import _output
from tfdet._runs import _builtins, _perturb

TARGET_HELP = (
    "TARGET is package.module:function, path/to/file.py:function or "
    "builtin:NAME; the function returns a compiled Keras model or "
    "(model, x, y). Without data, seeded batches are synthesized."
)


def epilog(exit_codes: str) -> str:
    """Built-in targets, perturbations and the subcommand's exit codes."""
    return (
        "Built-in targets:\n"
        + _builtins.describe()
        + "\n\nPerturbations:\n"
        + "\n".join(f"{n}: {d}" for n, d in _perturb.DESCRIPTIONS.items())
        + f"\n\nExit codes: {exit_codes}"
    )


def add(
    parser: argparse.ArgumentParser, *, default_steps: int, default_timeout: float
) -> None:
    """Adds TARGET, --steps, --perturb, --no-enable, --seed, --threads,
    --json and --timeout."""
    parser.add_argument("target", nargs="?", default=None, help="Default: builtin:cnn.")
    parser.add_argument(
        "--steps",
        type=int,
        default=default_steps,
        help=f"Training steps per run (default {default_steps}).",
    )
    parser.add_argument(
        "--perturb",
        default="all",
        help=f"Comma-separated from {', '.join(_perturb.ALL)}; 'all' (default: "
        "those that apply on this machine) or 'none' (identical processes).",
    )
    parser.add_argument(
        "--no-enable",
        dest="enable",
        action="store_false",
        help="Plain TensorFlow with only Keras seeds: what you get without tfdet.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="tfdet.enable(threads=N) (default 1); not with --no-enable.",
    )
    parser.add_argument("--json", metavar="FILE", help="Write the full report as JSON.")
    parser.add_argument(
        "--timeout", type=float, default=default_timeout, help="Seconds per run."
    )


def threads(args: argparse.Namespace) -> int:
    """The --threads value; with --no-enable there is nothing to pin.

    Raises:
        ValueError: --threads together with --no-enable.
    """
    if args.threads is not None and not args.enable:
        raise ValueError(
            "Expected --threads only with tfdet enabled: --no-enable runs plain "
            "TensorFlow, whose thread pools follow the cores. Drop one of them."
        )
    return 1 if args.threads is None else args.threads


def progress(message: str) -> None:
    """Progress lines go to stderr while runs are going."""
    _output.progress(f"  {message}")
