"""Flags shared by the subcommands that train TARGET in fresh processes.

`tfdet check` and `tfdet locate` start runs the same way (`tfdet._runner._spawn`,
`tfdet._protocol._perturb`) and take the same `tfdet._commands._options.RunOptions`,
so they take the same TARGET and run flags. The flags only parse; the
options object validates.
"""

from __future__ import annotations

import argparse
from typing import Any

from tfdet._cli import _output, usage_errors
from tfdet._commands import _options
from tfdet._pin import _settings
from tfdet._protocol import _emulation, _perturb
from tfdet._target import _builtins, _load

TARGET_HELP = (
    "package.module:function, path/to/file.py:function or builtin:NAME "
    f"(default {_load.DEFAULT_TARGET}); the function returns a compiled Keras "
    "model or (model, x, y). Without data, seeded batches are synthesized."
)


def _values() -> str:
    """The built-in targets and the perturbations, for the epilog."""
    return (
        "Built-in targets:\n"
        + _builtins.describe()
        + "\n\nPerturbations:\n"
        + "\n".join(f"{n}: {d}" for n, d in _perturb.DESCRIPTIONS.items())
    )


def add(parser: argparse.ArgumentParser) -> None:
    """Adds TARGET, --steps, --perturb, --no-enable, --seed, --threads,
    --json and --timeout, with the defaults of `RunOptions`, and lists the
    built-in targets and perturbations after them."""
    parser.epilog = _values()
    parser.add_argument(
        "target", nargs="?", default=None, metavar="TARGET", help=TARGET_HELP
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=_options.DEFAULT_STEPS,
        help=f"Training steps per run (default {_options.DEFAULT_STEPS}).",
    )
    parser.add_argument(
        "--perturb",
        default="all",
        help=f"Comma-separated from {', '.join(_perturb.KNOWN)}; 'all' (default: "
        f"{', '.join(_perturb.ALL)}, those that apply on this machine) or 'none' "
        "(identical processes).",
    )
    parser.add_argument(
        "--no-enable",
        dest="enable",
        action="store_false",
        help="Plain TensorFlow with only Keras seeds: what you get without tfdet.",
    )
    add_seed_and_threads(parser, threads_note="; not with --no-enable")
    parser.add_argument(
        "--patches",
        default=_options.DEFAULT_PATCHES,
        help="tfdet.enable(patches=...): comma-separated patch names, 'auto' "
        f"among them for the patches these versions need (default "
        f"{_options.DEFAULT_PATCHES!r}); auto,pool_size_free_products adds "
        "products whose bits do not follow --threads. Not with --no-enable.",
    )
    parser.add_argument(
        "--emulate-cpu",
        metavar="MODEL",
        default=None,
        help="QEMU CPU model of the emulated_cpu perturbation, which this flag "
        "selects (default: one of the other vendor than this CPU's, Haswell-v4 "
        "or EPYC-Rome; on aarch64 one with another vector unit, neoverse-n1 or "
        "max); with locate --record, the recording run is emulated. Needs "
        f"{_emulation.EXECUTABLE} ({_emulation.ARM_EXECUTABLE} on aarch64; "
        f"{_emulation.INSTALL}).",
    )
    parser.add_argument("--json", metavar="FILE", help="Write the full report as JSON.")
    parser.add_argument(
        "--timeout",
        type=float,
        default=_options.DEFAULT_TIMEOUT,
        help=f"Seconds per run, finite and > 0 (default {_options.DEFAULT_TIMEOUT:g}).",
    )


def add_seed_and_threads(
    parser: argparse.ArgumentParser, threads_note: str = ""
) -> None:
    """Adds --seed and --threads, the settings every command that pins shares."""
    parser.add_argument(
        "--seed",
        type=int,
        default=_settings.DEFAULT_SEED,
        help=f"tfdet.enable(seed=N), 0 to {_settings.MAX_SEED} (default "
        f"{_settings.DEFAULT_SEED}).",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=_settings.DEFAULT_THREADS,
        help=f"tfdet.enable(threads=N): the thread pools' size, 1 to "
        f"{_settings.MAX_THREADS} (default: the CPUs each process may use, "
        f"which under the default patches decide no bit){threads_note}.",
    )


def options(args: argparse.Namespace, **extra: Any) -> _options.RunOptions:
    """`RunOptions` from the shared flags plus `extra` fields.

    Raises:
        app.UsageError: a flag out of range (exit 2), with the options' message.
    """
    with usage_errors():
        return _options.RunOptions(
            target=args.target,
            steps=args.steps,
            perturb=tuple(_perturb.parse(args.perturb)),
            enable=args.enable,
            seed=args.seed,
            threads=args.threads,
            patches=tuple(name.strip() for name in args.patches.split(",")),
            timeout=args.timeout,
            emulate_cpu=args.emulate_cpu,
            **extra,
        )


def script_arguments(args: argparse.Namespace, command: str) -> list[str]:
    """The script's own arguments of `tfdet COMMAND --script train.py -- ARGS`.

    argparse takes the first argument after `--` as TARGET, and drops the
    next `--` from the rest; the script gets every word after the first
    `--`, as `python train.py ARGS` gives them (another `--` included). A
    TARGET given before `--` with --script is a usage error.
    """
    from absl import app

    script_args = list(args.script_args)
    if args.target is not None:
        after_dashes = getattr(args, "after_dashes", None)
        if not after_dashes or after_dashes[0] != args.target:
            raise app.UsageError(
                "Expected a TARGET or --script, not both. Received: TARGET "
                f"{args.target!r} and --script {args.script!r}. The script's own "
                f"arguments go after `--`: tfdet {command} --script train.py -- ARGS"
            )
        # After `--` every word is positional: TARGET and script_args hold
        # them all, less the `--` argparse removed.
        script_args = list(after_dashes)
        args.target = None
    return script_args


def progress(message: str) -> None:
    """Progress lines go to stderr while runs are going."""
    _output.progress(f"  {message}")
