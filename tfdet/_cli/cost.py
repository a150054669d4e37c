"""What determinism costs on your model, on this machine, and how to pay less.

Trains TARGET with train_on_batch (or runs a whole script with --script)
in one fresh process per setting, on the CPU: plain TensorFlow (Keras's seeding only), tfdet's default enable()
(one thread), and, where they apply, enable(threads=N) with N the cores this
process may use, the pool-size-free products at N threads, and XLA
(jit_compile=True). The processes take turns, block by block, so that the
machine's load falls on every setting alike. Prints each setting's ms per
step and ratio to plain TensorFlow with the middle half of the block ratios,
what its profile leaves to decide the bits (the core count, the CPU's
instruction set: a setting without any is portable), the ops whose time grew
most (TensorFlow's profiler) and one recommendation.

Exit codes: 0 measured, 2 bad input, 3 a run failed.
"""

from __future__ import annotations

import argparse

from absl import app

from tfdet._cli import _output, _training_flags, usage_errors, write_json
from tfdet._commands import _options
from tfdet._cost import _measure, _plot
from tfdet._target import _load

# The schedule's defaults, stated once in `_measure`.
DEFAULT_ROUNDS = _measure.DEFAULT_ROUNDS
DEFAULT_BLOCKS = _measure.DEFAULT_BLOCKS
DEFAULT_STEPS = _measure.DEFAULT_STEPS
DEFAULT_WARMUP = _measure.DEFAULT_WARMUP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="TARGET",
        help=_training_flags.TARGET_HELP,
    )
    parser.add_argument(
        "--script",
        metavar="SCRIPT",
        help="Time this training script instead, run whole and unchanged in each "
        "setting's process (from a copy of the working directory of its own), "
        "paused between blocks; its steps are fit batches, train_on_batch calls "
        "and eager optimizer updates. Arguments after `--` are the script's: "
        "tfdet cost --script train.py -- --epochs 1. XLA is the script's own "
        "choice, so not a setting here.",
    )
    parser.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="Rounds of fresh processes; from 2, each setting's digests also say "
        f"whether it repeats its bits (default {DEFAULT_ROUNDS}).",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=DEFAULT_BLOCKS,
        help=f"Interleaved blocks per round (default {DEFAULT_BLOCKS}).",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"Timed steps per setting per block (default {DEFAULT_STEPS}).",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"Untimed steps per process first (default {DEFAULT_WARMUP}).",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=_options.DEFAULT_TIMEOUT,
        help="Seconds a run may take for any one answer (its start and warm-up, a "
        f"block, the profile) before it is killed, exit 3 (default "
        f"{_options.DEFAULT_TIMEOUT:g}).",
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the report as JSON.")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="Also draw each setting's ratio to plain TensorFlow with its spread, "
        "and the ops that grew most (needs matplotlib: pip install 'tfdet[plot]').",
    )


def execute(args: argparse.Namespace) -> int:
    if min(args.rounds, args.blocks, args.steps) < 1 or args.warmup < 0:
        raise app.UsageError(
            "Expected --rounds, --blocks and --steps >= 1 and --warmup >= 0. "
            f"Received: rounds={args.rounds}, blocks={args.blocks}, "
            f"steps={args.steps}, warmup={args.warmup}."
        )
    with usage_errors():
        timeout = _options.check_timeout(args.timeout)
    if args.plot:
        try:
            _plot.require_matplotlib()
        except ImportError as error:
            raise app.UsageError(f"--plot: {error}") from error
    if args.script is not None:
        workload = _measure.Workload(
            script=args.script,
            args=tuple(_training_flags.script_arguments(args, "cost")),
        )
    elif args.script_args:
        raise app.UsageError(
            "Expected one TARGET. Received: "
            f"{' '.join([args.target or '', *args.script_args]).strip()!r}; "
            "arguments after `--` are a script's: tfdet cost --script train.py -- ARGS"
        )
    else:
        workload = _measure.Workload(target=args.target or _load.DEFAULT_TARGET)
    report = _measure.measure(
        workload,
        rounds=args.rounds,
        blocks=args.blocks,
        steps=args.steps,
        warmup=args.warmup,
        timeout=timeout,
        progress=_training_flags.progress,
    )
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, report.to_dict())
    if args.plot:
        _plot.plot_cost(report, args.plot)
    _output.out(str(report))
    return 0
