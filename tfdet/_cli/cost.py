"""What determinism costs on your model, on this machine, and how to pay less.

Trains TARGET with train_on_batch (or runs a whole script with --script)
in one fresh process per setting, on the CPU (on a GPU: see --device):
plain TensorFlow (Keras's seeding only), tfdet's default enable() (every
CPU this process may use, tfdet's kernels, AVX2 for what oneDNN still
computes), enable(threads=1) (the same bits on one thread, with more than
one CPU), enable(cpu_isa=None) (oneDNN's ops on the CPU's best
instructions), and XLA (jit_compile=True). The
processes take turns, block by block, so that the machine's load falls on
every setting alike. Prints each setting's ms per step and ratio to plain
TensorFlow with the middle half of the block ratios, its process's peak
memory (resident set, MB) and ratio to plain TensorFlow's, the tiers of
guarantee its profile gives (this-machine: the same CPU and threads;
any-thread-count; any-x86-cpu: AVX2 and up, any core count; any-batch:
predictions that do not follow the batch) less those the model's uncovered
ops take (tfdet.coverage()), and what its bits follow, the ops
whose time grew most (TensorFlow's profiler), the advice per tier and one
sentence for --need. A cheaper setting is advised over the
default one when it is more than 10% cheaper and faster in enough blocks
(a sign test); while the blocks cannot tell, more blocks run (up to twice
the schedule), then the advice says "inconclusive" and how many --blocks
to rerun with.

Exit codes: 0 measured (and, with --max-ratio, the advised setting within
it), 1 with --max-ratio: the advised setting's ratio is above it (when
inconclusive: even the cheaper of the two is; or no setting gives --need),
2 bad input, 3 a run failed, 4 --device gpu without a GPU.
"""

from __future__ import annotations

import argparse
import os

from absl import app

from tfdet._cli import (
    _output,
    _training_flags,
    check_output_file,
    usage_errors,
    write_json,
)
from tfdet._commands import _options
from tfdet._cost import _advice, _cost_plot, _cost_report, _measure
from tfdet._errors import EXIT_DIVERGED, EXIT_OK
from tfdet._pin import _tiers
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
        "setting's process (in an overlay or a copy of the working directory of its own), "
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
    parser.add_argument(
        "--xla",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Time the XLA setting (enable() + jit_compile=True) too; --no-xla "
        "leaves it out, since its first compile of a large model can take "
        "longer than the other settings' whole runs (default: timed, except "
        "for a --script, which compiles its own models).",
    )
    parser.add_argument(
        "--device",
        default=_measure.AUTO,
        choices=_measure.DEVICE_CHOICES,
        help="Where the runs train: 'cpu' (GPUs hidden), 'gpu' (exit 4 without "
        "one; the settings: plain TensorFlow, enable(), TensorFlow's own "
        "seeds + enable_op_determinism(), enable(threads=N), XLA), or 'auto' "
        "(default: the GPU where TensorFlow lists one, else the CPU).",
    )
    parser.add_argument(
        "--need",
        default=None,
        metavar="TIER[,TIER]",
        help="The guarantee to advise for: on the CPU "
        f"{', '.join(tier.name for tier in _tiers.CPU_TIERS)}; several, "
        "comma-separated, must all hold (default "
        f"{','.join(_cost_report.DEFAULT_NEED)}: what enable() gives); on a GPU "
        f"{_tiers.SAME_GPU.name} (the default there).",
    )
    parser.add_argument(
        "--max-ratio",
        type=float,
        default=None,
        metavar="R",
        help="Exit 1 when the advised setting's ratio to plain TensorFlow is "
        "above R (a CI gate: fails when determinism gets more expensive).",
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
    # Exit 4 without a GPU for --device gpu, before any other check.
    device = _measure.resolve_device(args.device)
    with usage_errors():
        need = _tiers.check_names(
            [name.strip() for name in args.need.split(",") if name.strip()]
            if args.need is not None
            else list(_cost_report.default_need(device)),
            _cost_report.device_tiers(device),
        )
        if args.max_ratio is not None:
            _advice.check_max_ratio(args.max_ratio, "--max-ratio")
    # Everything the measurement's end needs is checked before it starts.
    if args.plot:
        check_output_file(args.plot, "--plot")  # Before matplotlib's import.
        try:
            _cost_plot.check_path(args.plot)
        except (ImportError, ValueError) as error:
            raise app.UsageError(f"--plot: {error}") from error
    if args.script is not None:
        workload = _measure.Workload(
            script=args.script,
            args=tuple(_training_flags.script_arguments(args, "cost")),
        )
        if not os.path.isfile(args.script):
            raise app.UsageError(
                "Expected --script to name a Python script. No such file: "
                f"{args.script!r}"
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
        need=need,
        device=device,
        xla=args.xla,
    )
    return conclude(report, args)


def conclude(report: _cost_report.CostReport, args: argparse.Namespace) -> int:
    """Writes `report` (JSON, picture, text) and applies `--max-ratio`."""
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, report.to_dict())
    if args.plot:
        _cost_plot.plot_cost(report, args.plot)
    _output.out(str(report))
    if args.max_ratio is None:
        return EXIT_OK
    failed = _advice.over_gate(report.advice(), args.max_ratio)
    if failed is None:
        return EXIT_OK
    _output.err(f"tfdet cost: {failed} (exit {int(EXIT_DIVERGED)})")
    return EXIT_DIVERGED
