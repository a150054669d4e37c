"""`tfdet check`: train in fresh processes that look like different machines.

Every run records a trace (the format of `tfdet.DeterminismCallback`: every
step's loss and metric bits and weight fingerprints) and its final weights.
The check passes only when every run finishes and each run is bit-identical
to the baseline run (`tfdet._record._compare`: the traces step by step as
`tfdet diff` compares them, every variable's exact final digest, the `batch`
perturbation's predictions). When they differ, the report names the first
diverging step and quantity, and which perturbation separates the runs: the
baseline is re-run with one perturbation at a time (and once with none,
which exposes a target that is nondeterministic by itself).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from typing import Any

from tfdet._commands import _progress_lines
from tfdet._commands._check_report import (
    Attribution,
    CheckReport,
    DeviceReport,
    DivergenceReport,
    RunReport,
    Training,
    attribution_verdict,
    responsible_of,
)
from tfdet._commands._options import RunOptions, RunPlan
from tfdet._commands._progress_lines import ProgressFn, StepFn
from tfdet._commands._report_common import (
    ProcessFacts,
    combined_exit_code,
    result_of,
)
from tfdet._errors import (
    EXIT_DIVERGED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    Error,
)
from tfdet._pin import _devices
from tfdet._protocol import _perturb, _spec
from tfdet._protocol._result import CheckResult
from tfdet._record import _bits, _compare, _diff, _trace
from tfdet._runner import _outcome, _preflight, _spawn
from tfdet.patches import pool_size_free_products

RERUN = "none (a re-run of the baseline)"


def _nonfinite(trace: _trace.Trace) -> list[str]:
    """`"loss nan from step 3"` for each logged quantity that is NaN or Inf."""
    found: dict[str, str] = {}
    for record in trace.steps:
        values = {"loss": record.get("loss"), **(record.get("metrics") or {})}
        for name, bits in values.items():
            if (
                bits is not None
                and name not in found
                and _bits.is_finite(bits) is False
            ):
                found[name] = f"{name} {bits.get('value')} from step {record['step']}"
    return list(found.values())


def _run_report(run: _outcome.RunOutcome, kept_trace: str | None = None) -> RunReport:
    """`run`'s report; `kept_trace` is its trace's kept copy (`traces=`)."""
    training = None
    if run.ok and run.trace is not None:
        result = result_of(run, CheckResult)
        steps = run.trace.steps
        training = Training(
            profile=result.profile,
            steps_recorded=len(steps),
            final_loss=((steps[-1].get("loss") if steps else None) or {}).get("value"),
            nonfinite=tuple(_nonfinite(run.trace)),
            trace=kept_trace or result.trace,
            # What ran: the entry point tfdet drove, and whether XLA compiled it.
            entry_points=list(result.entry_points),
            xla=result.xla,
            coverage=result.coverage,
        )
    return RunReport(
        facts=ProcessFacts.of(run),
        training=training,
        # Without TensorFlow's start-up notices (`_outcome.stderr_tail`).
        stderr_tail=None if run.ok else run.stderr_tail,
    )


@dataclasses.dataclass(frozen=True)
class _Compared:
    """A finished process of a check's run as the comparisons read it
    (`_compare.FinishedRun`): its trace, read back, and its result."""

    trace: _trace.Trace
    result: CheckResult


def _trace_of(run: _outcome.RunOutcome) -> _trace.Trace:
    """A finished process's trace, read back (`_spawn.read_traces`)."""
    if run.trace is None:
        raise TypeError(f"Expected {run.setup.name}'s trace, read back. Received: None")
    return run.trace


def _compared(job: list[_outcome.RunOutcome]) -> _compare.Job:
    """A run's finished processes, as the comparisons read them."""
    return [_Compared(_trace_of(run), result_of(run, CheckResult)) for run in job]


def _through_step(divergence: _diff.Divergence) -> int | None:
    """The last step attribution re-runs need, or None for every step.

    A divergence seen in a step record is decided by that step, so re-runs
    can stop there; one seen only in the final weights (or a step missing
    from one trace) needs the whole run.
    """
    if divergence.quantity.startswith(("final weights", "prediction")) or (
        divergence.quantity == "steps"
    ):
        return None
    return divergence.step


def _attribute(
    plan: RunPlan,
    other: _perturb.RunSetup,
    divergence: _diff.Divergence,
    options: RunOptions,
    workdir: str,
    baseline_job: list[_outcome.RunOutcome],
    progress: ProgressFn | None = None,
) -> Attribution:
    """Re-runs the baseline with each of `other`'s perturbations alone.

    The re-runs train only through the step where the runs parted (all of
    them run at once, so the slowest decides the wall time).
    """
    spec = plan.spec
    candidates, setups = zip(*plan.setups[0].one_at_a_time(other), strict=True)
    through = _through_step(divergence)
    if through is not None:
        spec = dataclasses.replace(spec, steps=through + 1)
    if progress is not None:
        progress(
            f"diverged; re-running {len(setups)} processes at once for "
            f"{spec.steps} step(s) to find the perturbation responsible "
            f"(each stopped after {options.timeout:.0f} s)"
            f"{_progress_lines.slow_note(setups, options.timeout)}"
        )
    reruns = _spawn.read_traces(
        _spawn.run_jobs(
            setups,
            spec,
            workdir,
            base_env=plan.environment,
            timeout=options.timeout,
        )
    )
    same = "same bits" if through is None else f"same bits through step {through}"
    alone: dict[str, str] = {}
    for name, rerun in zip(candidates, reruns, strict=True):
        key = RERUN if name is None else name
        failed = next((run for run in rerun if not run.ok), None)
        if failed is not None:
            alone[key] = f"run failed ({failed.reason})"
        elif _compare.same_through(_compared(baseline_job), _compared(rerun), through):
            alone[key] = same
        else:
            alone[key] = "differs"
    responsible = responsible_of(alone, RERUN)
    verdict = attribution_verdict(alone, RERUN, "target")
    pool_size_ops: tuple[str, ...] = ()
    if _perturb.THREADS in responsible:
        pool_size_ops = tuple(
            sorted({op for run in baseline_job for op in _pool_size_ops(run)})
        )
        verdict += "; " + _pool_size_note(pool_size_ops)
    return Attribution(
        alone=alone,
        responsible=tuple(responsible),
        verdict=verdict,
        steps_rerun=spec.steps,
        pool_size_ops=pool_size_ops,
    )


def _pool_size_ops(run: _outcome.RunOutcome) -> list[str]:
    return list(run.result.pool_size_ops) if run.ok and run.result else []


def _pool_size_note(ops: tuple[str, ...]) -> str:
    """Which of the runs' ops follow the pool size, and what frees them."""
    if not ops:
        return (
            "none of the ops known to follow the pool size ran in a traced "
            "function (a full Sum or Mean over a whole large tensor, or an op "
            "run eagerly, may): tfdet locate --perturb threads names the first "
            "layer that differs"
        )
    covered = [op for op in ops if op in pool_size_free_products.COVERED]
    note = f"the thread-pool size decides the bits of {', '.join(ops)} in these runs"
    if covered:
        note += (
            f"; the patch {pool_size_free_products.PATCH.name} (in the default) computes "
            f"{', '.join(covered)} apart from it"
        )
    others = [op for op in ops if op not in covered]
    if others:
        note += f"; nothing in tfdet does yet for {', '.join(others)}"
    return note


def _keep_trace(run: _outcome.RunOutcome, directory: str | None) -> str | None:
    """Copies a finished process's trace to `directory/runN[-workerK].jsonl`."""
    if directory is None or not run.ok:
        return None
    kept = os.path.join(directory, f"{run.setup.file_stem}.jsonl")
    shutil.copyfile(result_of(run, CheckResult).trace, kept)
    return kept


def _divergence_report(
    device: str,
    a: _outcome.RunOutcome,
    b: _outcome.RunOutcome,
    divergence: _diff.Divergence,
    worker: int | None,
    **extra: Any,
) -> DivergenceReport:
    """`extra`: the `workers` that disagree, or the `attribution`."""
    return DivergenceReport(
        device=device,
        runs=(a.setup.index, b.setup.index),
        # Multi-worker runs: which worker's bits parted (None: one process).
        worker=worker,
        found=divergence,
        description=divergence.describe(),
        # Reported first: a setting that differs usually explains the bits.
        profile_differences={
            name: list(values)
            for name, values in _diff.profile_differences(
                _trace_of(a), _trace_of(b)
            ).items()
        },
        **extra,
    )


def _check_device(
    device: str,
    options: RunOptions,
    progress: ProgressFn | None,
    workdir: str,
    step: StepFn | None = None,
) -> DeviceReport:
    plan = options.plan(_spec.CHECK, device)
    if progress is not None:
        # TensorFlow takes seconds to start: say so before the first step.
        processes = f"{len(plan.setups)} processes"
        if options.workers > 1:
            processes = f"{len(plan.setups)} runs of {options.workers} worker processes"
        progress(
            f"[{device}] starting TensorFlow in {processes} ({options.steps} "
            f"steps each){_progress_lines.slow_note(plan.setups, options.timeout)}"
        )
    jobs = _spawn.run_jobs(
        plan.setups,
        plan.spec,
        workdir,
        base_env=plan.environment,
        timeout=options.timeout,
        progress=_progress_lines.steps_to(progress, step, device),
    )
    _preflight.raise_unbuilt_target(
        [run for job in jobs for run in job],
        options.target_spec.text,
        options.timeout,
    )
    jobs = _spawn.read_traces(jobs)
    runs = [run for job in jobs for run in job]
    kept_in = None if options.traces is None else os.path.join(options.traces, device)
    report = functools.partial(
        DeviceReport,
        status="ran",
        runs=tuple(_run_report(run, _keep_trace(run, kept_in)) for run in runs),
        steps=options.steps,
        workers=options.workers,
        replicas=options.replicas,
        perturbations=tuple(options.perturb),
        perturbations_skipped=plan.skipped,
    )
    if any(not run.ok for run in runs):
        return report(exit_code=EXIT_RUN_FAILED)
    for a, b, pairs in _compare.comparisons([_compared(job) for job in jobs]):
        worker, divergence = _compare.earliest(pairs)
        if divergence is None:
            continue
        extra: dict[str, Any]
        reported: int | None = worker
        if a == b:  # Two workers of one run disagree.
            first, second, extra = jobs[a][0], jobs[a][worker], {"workers": (0, worker)}
        else:
            first, second = jobs[a][worker], jobs[b][worker]
            attribution = None
            if options.attribute:
                attribution = _attribute(
                    plan,
                    plan.setups[b],
                    divergence,
                    options,
                    workdir,
                    jobs[a],
                    (lambda message: progress(f"[{device}] {message}"))
                    if progress
                    else None,
                )
            extra = {"attribution": attribution}
            reported = worker if options.workers > 1 else None
        found = _divergence_report(device, first, second, divergence, reported, **extra)
        return report(divergence=found, exit_code=EXIT_DIVERGED)
    return report(exit_code=EXIT_OK)


def _prepare_traces(directory: str, devices: list[str]) -> None:
    for device in devices:
        path = os.path.join(directory, device)
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(f"{path!r} is not writable")
        except OSError as error:
            raise Error(
                f"Expected `traces` to name a directory tfdet can write. Received: "
                f"{directory!r} ({error})"
            ) from error


def check(
    options: RunOptions,
    progress: ProgressFn | None = None,
    on_step: StepFn | None = None,
) -> CheckReport:
    """Runs the check and returns its report (`to_dict()`: `tfdet check --json`).

    `progress` gets one line per event; each run's steps go to `on_step`
    when given (a display that updates in place), else to `progress`.

    With `options.traces`, each finished run's trace is kept as
    `TRACES/DEVICE/runN.jsonl` (N from 0, the baseline; `runN-workerK.jsonl`
    for each worker of a multi-worker run): `tfdet diff` of two of them
    reaches the verdict the check reached for their steps.

    With `options.workers > 1`, each run is a `MultiWorkerMirroredStrategy`
    job of that many fresh worker processes on loopback; worker K of every
    run is compared with worker K of the baseline, and the workers of each
    run with each other. With `options.replicas > 1`, each run is one
    process training under a `MirroredStrategy` of that many logical CPUs.

    Raises:
        TargetError: the TARGET cannot be built (no run built it).
        DeviceUnavailableError: `device="gpu"` without a visible GPU.
        Error: `options.traces` cannot be written (exit 2).
    """
    if options.device == "gpu":
        _devices.require_gpu()
    gpu = options.device == "gpu" or (
        options.device == "all" and _devices.gpu_visible()
    )
    wanted = ["cpu", "gpu"] if options.device == "all" else [options.device]
    if options.traces is not None:
        _prepare_traces(options.traces, [d for d in wanted if d != "gpu" or gpu])
    devices: dict[str, DeviceReport] = {}
    with tempfile.TemporaryDirectory(prefix="tfdet-check-") as workdir:
        for device in wanted:
            if device == "gpu" and not gpu:
                devices["gpu"] = DeviceReport.skipped("no GPU visible")
                continue
            if device == "gpu" and options.distributed:
                devices["gpu"] = DeviceReport.skipped(
                    "`workers` and `replicas` are checked on the CPU only"
                )
                continue
            device_dir = os.path.join(workdir, device)
            os.makedirs(device_dir)
            devices[device] = _check_device(
                device, options, progress, device_dir, on_step
            )
    ran = [d for d in devices.values() if d.ran]
    return CheckReport(
        target=options.target_spec.text,
        enable=options.enable,
        seed=options.seed,
        threads=options.threads,
        patches=options.patches,
        runs_per_device=options.runs,
        steps=options.steps,
        workers=options.workers,
        replicas=options.replicas,
        traces=options.traces,
        devices=devices,
        # The runs are imitations of other machines on this one (one may be
        # an emulated CPU): say which differences they stood for, and which
        # no run here could.
        **_perturb.imitation_sections(
            [
                name
                for name in options.perturb
                if any(name not in d.perturbations_skipped for d in ran)
            ],
            options.emulate_cpu,
        ),
        # A device that ran has its exit code.
        exit_code=combined_exit_code(
            [d.exit_code for d in ran if d.exit_code is not None]
        ),
    )
