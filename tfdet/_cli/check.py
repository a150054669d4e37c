"""Train in fresh processes that imitate different machines; compare every bit.

Trains TARGET with train_on_batch in N fresh processes, started together,
each perturbed to imitate another machine, and compares every step's loss and
metric bits and every weight bit. Each run records a trace (the format of
tfdet.DeterminismCallback) that is compared as `tfdet diff` compares traces;
--traces DIR keeps them.

Exit codes: 0 bit-identical, 1 diverged, 2 bad input, 3 a run failed or timed
out, 4 device not available.
"""

from __future__ import annotations

import argparse

from tfdet._cli import (
    _check_text,
    _output,
    _training_flags,
    as_flags,
    usage_errors,
    write_json,
)
from tfdet._commands import _api, _options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _training_flags.add(parser)
    parser.add_argument(
        "--runs",
        type=int,
        default=_options.DEFAULT_RUNS,
        help=f"Processes, >= 2 (default {_options.DEFAULT_RUNS}).",
    )
    parser.add_argument(
        "--device",
        default=_options.DEFAULT_DEVICE,
        choices=_options.DEVICES,
        help="Where the runs train: 'cpu' (GPUs hidden), 'gpu' (exit 4 without "
        "one), or 'all' (default: the CPU, then the GPU where TensorFlow sees "
        "one).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=_options.DEFAULT_WORKERS,
        help="Make each run a MultiWorkerMirroredStrategy job of N worker "
        "processes on loopback (127.0.0.1, free ports); TARGET is built inside "
        "the strategy's scope and trained with model.fit. Every worker of every "
        "run is compared; CPU only (default 1: one process, no strategy).",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=_options.DEFAULT_REPLICAS,
        help="Train each run under a MirroredStrategy of N logical CPU devices "
        "in one process (default 1: no strategy).",
    )
    parser.add_argument(
        "--traces",
        metavar="DIR",
        help="Keep each run's trace as DIR/DEVICE/runN.jsonl (run0 is the "
        "baseline; e.g. DIR/cpu/run0.jsonl, DIR/cpu/run1.jsonl): `tfdet diff "
        "DIR/cpu/run0.jsonl DIR/cpu/run1.jsonl` compares them as check did.",
    )
    parser.add_argument(
        "--no-attribute",
        dest="attribute",
        action="store_false",
        help="On divergence, skip the re-runs that find the perturbation responsible.",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="Also run the same perturbations without tfdet, and say whether they "
        "separate plain TensorFlow at all (where they do not, an identical "
        "verdict proves little). Twice the runs.",
    )
    parser.add_argument(
        "--script",
        metavar="SCRIPT",
        help="Run this training script, unchanged and whole, in each run (as "
        "`tfdet run` does) instead of TARGET, recording every fit call, "
        "train_on_batch call and custom loop's optimizer updates; arguments "
        "after `--` are the script's: tfdet check --script train.py -- --lr 0.1.",
    )
    # `tfdet check --script train.py -- ARGS`: after `--`, TARGET takes the
    # first of the script's arguments and this the rest (see _execute_script).
    parser.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="With --script: stop each run after N recorded training steps "
        "(default: let the script finish).",
    )
    parser.add_argument(
        "--copies",
        action="store_true",
        help="With --script: give each run a copy of the working directory "
        "(small files copied, the rest linked and watched) instead of an "
        "overlay of its own, which is used where Linux allows it.",
    )


def _execute_script(args: argparse.Namespace) -> int:
    from absl import app

    from tfdet._commands import _script_check

    if (
        args.steps != _options.DEFAULT_STEPS
        or args.traces
        or args.device == "gpu"
        or args.workers != _options.DEFAULT_WORKERS
        or args.replicas != _options.DEFAULT_REPLICAS
    ):
        raise app.UsageError(
            "Expected no --steps, --traces, --device gpu, --workers or --replicas "
            f"with --script. Received: steps={args.steps}, traces={args.traces!r}, "
            f"device={args.device!r}, workers={args.workers}, "
            f"replicas={args.replicas}. The script decides its steps (stop it "
            "early with --max-steps N) and its distribution strategy; its runs "
            "are single processes on the CPU."
        )
    script_args = _training_flags.script_arguments(args, "check")
    with usage_errors():
        options = _script_check.ScriptOptions(
            script=args.script,
            args=tuple(script_args),
            run=_training_flags.options(
                args,
                runs=args.runs,
                device="cpu",
                attribute=args.attribute,
                control=args.control,
            ),
            max_steps=args.max_steps,
            overlay=not args.copies,
        )
    result = _script_check.check_script(options, progress=_training_flags.progress)
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, result.to_dict())
    # The library names options the Python way (`workers`): say them as flags.
    _output.out(as_flags(_check_text.format_script_report(result)))
    return result.exit_code


def execute(args: argparse.Namespace) -> int:
    if getattr(args, "script", None) is not None:
        return _execute_script(args)
    if (
        getattr(args, "max_steps", None) is not None
        or getattr(args, "script_args", None)
        or getattr(args, "copies", False)
    ):
        from absl import app

        raise app.UsageError(
            "Expected --script with --max-steps, --copies or script arguments. "
            "Received: no --script. Use `tfdet check --script train.py "
            "--max-steps N`."
        )
    options = _training_flags.options(
        args,
        runs=args.runs,
        device=args.device,
        attribute=args.attribute,
        control=args.control,
        traces=args.traces,
        workers=args.workers,
        replicas=args.replicas,
    )
    display = _output.StepsDisplay()
    # The header first: TensorFlow takes seconds to start in the runs.
    _output.progress(_check_text.format_header(options))
    try:
        result = _api.check_with_options(options, display.message, display.step)
    finally:
        display.finish()
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, result.to_dict())
    # The library names options the Python way (`workers`): say them as flags.
    _output.out(as_flags(_check_text.format_report(result)))
    return result.exit_code
