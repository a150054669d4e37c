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
from typing import Any

from tfdet._cli import _output, _training_flags, write_json
from tfdet._runs import _api, _options


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


def _run_line(run: dict[str, Any]) -> str:
    labels = "; ".join(run["perturbations"].values()) or "no perturbation"
    if run["ok"]:
        loss = run.get("final_loss")
        state = "ok" if loss is None else f"ok, final loss {loss}"
    else:
        state = run.get("reason") or "failed"
    return f"  {_name(run)} ({state}, {run['seconds']:.1f}s): {labels}"


def _name(run: dict[str, Any]) -> str:
    """`run 1`, or `run 1 worker 0` (reports of older versions lack `name`)."""
    return run.get("name") or f"run {run['index']}"


def _distribution(workers: int, replicas: int) -> str:
    if workers > 1:
        return f" ({workers} workers each, MultiWorkerMirroredStrategy on loopback)"
    if replicas > 1:
        return f" ({replicas} replicas each, MirroredStrategy on logical CPUs)"
    return ""


def format_header(options: _options.RunOptions) -> str:
    """What is about to run: printed before anything starts."""
    mode = _options.mode_label(options.enable)
    return (
        f"tfdet check {options.target_spec.text} {mode}: {options.runs} runs"
        f"{_distribution(options.workers, options.replicas)} x "
        f"{options.steps} steps on {options.device}; perturbations: "
        f"{', '.join(options.perturb) or 'none'}"
    )


def _what_ran(run: dict[str, Any]) -> list[str]:
    """What a finished run exercised: entry point, steps, XLA (and why not)."""
    xla = run.get("xla")
    if not run.get("ok") or xla is None:
        return []
    ran = ", ".join(run.get("entry_points") or []) or "nothing"
    return [
        f"    ran: {run.get('steps_recorded')} steps via {ran}; "
        f"XLA {'on' if xla.get('on') else 'off'}"
    ]


def _xla_notice(runs: list[dict[str, Any]]) -> list[str]:
    """Once per device: Keras dropped the user's jit_compile=True."""
    notices = {(r.get("xla") or {}).get("notice") for r in runs} - {None}
    return [f"  {notice}" for notice in sorted(notices)]


def format_report(report: dict[str, Any]) -> str:
    """The short human report: per device, runs, perturbations, verdict."""
    mode = _options.mode_label(report["enable"])
    lines = [
        f"tfdet check {report['target']} {mode}: {report['runs']} runs"
        f"{_distribution(report.get('workers', 1), report.get('replicas', 1))} x "
        f"{report['steps']} steps"
    ]
    for device, result in report["devices"].items():
        if result.get("status") == "skipped":
            lines.append(f"{device.upper()}: skipped, {result['reason']}")
            continue
        lines.append(f"{device.upper()}: {result['verdict'].upper()}")
        nonfinite = False
        for run in result["runs"]:
            lines.append(_run_line(run))
            lines.extend(_what_ran(run))
            for what in run.get("nonfinite") or []:
                nonfinite = True
                lines.append(f"    not finite: {what}")
            if run.get("trace") and report.get("traces"):
                lines.append(f"    trace: {run['trace']}")
        lines.extend(_xla_notice(result["runs"]))
        for name, reason in result.get("perturbations_skipped", {}).items():
            lines.append(f"  perturbation {name} not applied: {reason}")
        if result["verdict"] == "failed":
            for run in result["runs"]:
                if not run["ok"]:
                    lines.append(
                        f"  {_name(run)} failed ({run.get('reason')}); stderr tail:"
                    )
                    lines.extend(
                        f"    {line}"
                        for line in run.get("stderr_tail", "").splitlines()
                    )
        divergence = result.get("divergence")
        if divergence:
            a, b = divergence["runs"]
            workers = divergence.get("workers")
            if workers:  # Two workers of one run disagree.
                a, b = f"{a} worker {workers[0]}", f"{b} worker {workers[1]}"
            elif divergence.get("worker") is not None:
                a = f"{a} worker {divergence['worker']}"
                b = f"{b} worker {divergence['worker']}"
            for name, (left, right) in divergence.get(
                "profile_differences", {}
            ).items():
                lines.append(
                    f"  profile differs (run {a} vs run {b}): {name}: {left} vs {right}"
                )
            lines.append(
                f"  first divergence (run {a} vs run {b}): {divergence['description']}"
            )
            attribution = divergence.get("attribution")
            if attribution:
                lines.append(f"  cause: {attribution['verdict']}")
                for name, outcome in attribution["alone"].items():
                    lines.append(f"    {name} alone: {outcome}")
        elif result["verdict"] == "identical":
            processes = len(result["runs"])
            across = f"{processes} runs"
            if result.get("workers", 1) > 1:
                across = (
                    f"{processes // result['workers']} runs x "
                    f"{result['workers']} workers"
                )
            lines.append(
                f"  every loss, metric and weight bit identical across {across}"
            )
            if nonfinite:
                lines.append(
                    "  but the training produced NaN or Inf (above): identical bits "
                    "of a broken training prove little; fix the model or data first"
                )
    imitated = ", ".join(report.get("imitated") or {}) or "nothing"
    not_imitated = ", ".join(
        name.replace("_", " ") for name in report.get("not_imitated") or {}
    )
    emulated = "".join(
        f"; emulated: {text.split(':')[0]}"
        for text in (report.get("emulated") or {}).values()
    )
    lines.append(
        f"imitated other machines on this one by: {imitated}{emulated}; not "
        f"imitated: {not_imitated} (compare traces from two real machines with "
        "tfdet diff)"
    )
    lines.append(f"verdict: {report['verdict']} (exit {report['exit_code']})")
    return "\n".join(lines)


def _execute_script(args: argparse.Namespace) -> int:
    from absl import app

    from tfdet._runs import _script_check

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
    script_args = list(args.script_args)
    after_dashes = getattr(args, "after_dashes", None)
    if args.target is not None:
        if not after_dashes or after_dashes[0] != args.target:
            raise app.UsageError(
                "Expected a TARGET or --script, not both. Received: TARGET "
                f"{args.target!r} and --script {args.script!r}. The script's own "
                "arguments go after `--`: tfdet check --script train.py -- ARGS"
            )
        # `tfdet check --script train.py -- --lr 0.1`: argparse takes the
        # first argument after `--` as TARGET.
        script_args.insert(0, args.target)
        args.target = None
    try:
        options = _script_check.ScriptOptions(
            script=args.script,
            args=tuple(script_args),
            run=_training_flags.options(
                args, runs=args.runs, device="cpu", attribute=False
            ),
            max_steps=args.max_steps,
        )
    except ValueError as error:
        if isinstance(error, app.UsageError):
            raise
        raise app.UsageError(str(error)) from error
    report = _script_check.check_script(options, progress=_training_flags.progress)
    write_json(args.json, report)
    _output.out(_script_check.format_report(report))
    return report["exit_code"]


def execute(args: argparse.Namespace) -> int:
    if getattr(args, "script", None) is not None:
        return _execute_script(args)
    if getattr(args, "max_steps", None) is not None or getattr(
        args, "script_args", None
    ):
        from absl import app

        raise app.UsageError(
            "Expected --script with --max-steps or script arguments. Received: "
            "no --script. Use `tfdet check --script train.py --max-steps N`."
        )
    options = _training_flags.options(
        args,
        runs=args.runs,
        device=args.device,
        attribute=args.attribute,
        traces=args.traces,
        workers=args.workers,
        replicas=args.replicas,
    )
    display = _output.StepsDisplay()
    # The header first: TensorFlow takes seconds to start in the runs.
    _output.progress(format_header(options))
    try:
        result = _api.check_with_options(options, display.message, display.step)
    finally:
        display.finish()
    report = result.to_dict()
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, report)
    _output.out(format_report(report))
    return result.exit_code
