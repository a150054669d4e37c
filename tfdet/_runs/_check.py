"""`tfdet check`: train in fresh processes that look like different machines.

The check passes only when every run finishes and every step's loss and
metric bits and every weight bit equal the baseline run's. When they do not,
the report names the first diverging step and quantity, and which
perturbation separates the runs: the baseline is re-run with one perturbation
at a time (and once with none, which exposes a target that is
nondeterministic by itself).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any

from tfdet._errors import (
    EXIT_DIVERGED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    DeviceUnavailableError,
)
from tfdet._pin import _devices, _enable
from tfdet._pin._profile import Profile
from tfdet._record import _compare
from tfdet._runs import _perturb, _spawn, _target

DEFAULT_STEPS = 3
DEFAULT_RUNS = 2
DEFAULT_TIMEOUT = 600.0
RERUN = "none (a re-run of the baseline)"


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """What `tfdet check` runs. Field names mirror the CLI flags."""

    target: str | None = None
    runs: int = DEFAULT_RUNS
    steps: int = DEFAULT_STEPS
    device: str = "all"
    perturb: tuple[str, ...] = _perturb.ALL
    enable: bool = True
    seed: int = 0
    threads: int = 1
    cpu_isa: str | None = "AVX2"
    timeout: float = DEFAULT_TIMEOUT
    attribute: bool = True


ProgressFn = Callable[[str], None]


def _validate(options: CheckOptions) -> None:
    if options.runs < 2:
        raise ValueError(f"Expected --runs >= 2. Received: runs={options.runs}")
    if options.steps < 1:
        raise ValueError(f"Expected --steps >= 1. Received: steps={options.steps}")
    if options.device not in ("cpu", "gpu", "all"):
        raise ValueError(
            f"Expected --device to be cpu, gpu or all. Received: device={options.device!r}"
        )
    if options.timeout <= 0:
        raise ValueError(f"Expected --timeout > 0. Received: timeout={options.timeout}")
    validate_run_settings(options)


def validate_run_settings(options: Any) -> None:
    """Checks seed and threads in the parent, as `tfdet.enable()` would.

    Otherwise a bad value would only surface inside every run (exit 3).

    Raises:
        ValueError: naming the flag and the accepted values.
    """
    _enable._check_int("seed", options.seed, 0, _enable.MAX_SEED)
    _enable._check_int("threads", options.threads, 1, None)


def preflight(target: str | None) -> _target.TargetSpec:
    """Checks the TARGET in this process before any run is spawned.

    Built-in targets are known to be good and are only parsed; other targets
    are imported and called once, so a missing module, a missing function or
    a function that returns no compiled model exits 2 before anything starts.
    """
    spec = _target.parse(target)
    if not spec.text.startswith("builtin:"):
        _devices.hide_gpus()  # The parent only inspects; the GPU is for the runs.
        _target.build(spec.text)
    return spec


def run_environment(spec: _target.TargetSpec, device: str) -> dict[str, str]:
    """The environment the runs of TARGET on `device` start from."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if spec.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if device == "cpu":
        # Hide GPUs so that CPU runs are really on the CPU.
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    else:
        # Concurrent runs share the GPU: none may take all its memory.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return env


def make_worker_spec(spec: _target.TargetSpec, options: Any) -> dict[str, Any]:
    """The JSON spec a worker gets (see `tfdet._runs._worker.start`).

    Args:
        spec: The parsed TARGET.
        options: Anything with seed, steps, enable, threads and cpu_isa
            (`CheckOptions`, `tfdet._runs._locate.LocateOptions`).
    """
    return {
        "target": spec.text,
        "seed": options.seed,
        "steps": options.steps,
        "enable": options.enable,
        "threads": options.threads,
        "cpu_isa": options.cpu_isa,
    }


def _run_report(outcome: _spawn.RunOutcome) -> dict[str, Any]:
    report: dict[str, Any] = {
        "index": outcome.setup.index,
        "perturbations": outcome.setup.labels,
        "ok": outcome.ok,
        "returncode": outcome.returncode,
        "timed_out": outcome.timed_out,
        "seconds": round(outcome.seconds, 3),
    }
    if outcome.result is not None:
        report["profile"] = outcome.result["profile"]
        report["steps_recorded"] = len(outcome.result["steps"])
        report["final_loss"] = (
            outcome.result["steps"][-1]["values"].get("loss") or {}
        ).get("value")
    if not outcome.ok:
        report["stderr_tail"] = outcome.stderr_tail
    return report


def _attribute(
    baseline: _spawn.RunOutcome,
    other: _spawn.RunOutcome,
    spec: dict[str, Any],
    env: dict[str, str],
    timeout: float,
    workdir: str,
) -> dict[str, Any]:
    """Re-runs the baseline with each of `other`'s perturbations alone."""
    differing = [
        name
        for name, label in other.setup.labels.items()
        if baseline.setup.labels.get(name) != label
    ]
    candidates: list[str | None] = [None, *differing]
    setups = [
        dataclasses.replace(
            baseline.setup.with_perturbation_of(other.setup, name, 100 + k), delay=0.0
        )
        for k, name in enumerate(candidates)
    ]
    outcomes = _spawn.run_all(setups, spec, workdir, base_env=env, timeout=timeout)
    alone: dict[str, str] = {}
    for name, outcome in zip(candidates, outcomes, strict=True):
        key = RERUN if name is None else name
        if not outcome.ok:
            alone[key] = "run failed"
        elif _compare.first_divergence(baseline.result, outcome.result) is None:
            alone[key] = "same bits"
        else:
            alone[key] = "differs"
    responsible = [name for name in differing if alone.get(name) == "differs"]
    if alone.get(RERUN) == "differs":
        verdict = (
            "the target is nondeterministic by itself: a re-run with the "
            "baseline's exact settings also differs"
        )
    elif responsible:
        verdict = "separated by " + ", ".join(responsible)
    else:
        verdict = "no single perturbation reproduces it alone (a combination, or flaky)"
    return {"alone": alone, "responsible": responsible, "verdict": verdict}


def _check_device(
    device: str,
    options: CheckOptions,
    spec: _target.TargetSpec,
    progress: ProgressFn | None,
    workdir: str,
) -> dict[str, Any]:
    names = list(options.perturb)
    setups = _perturb.plan(
        options.runs, names, _perturb.pinned_cap(options), options.threads
    )
    env = run_environment(spec, device)
    worker_spec = make_worker_spec(spec, options)

    def on_step(index: int, done: int, total: int) -> None:
        if progress is not None:
            progress(f"[{device}] run {index}: step {done}/{total}")

    outcomes = _spawn.run_all(
        setups,
        worker_spec,
        workdir,
        base_env=env,
        timeout=options.timeout,
        progress=on_step,
    )
    report: dict[str, Any] = {
        "status": "ran",
        "runs": [_run_report(outcome) for outcome in outcomes],
        "steps": options.steps,
        "perturbations": names,
        "perturbations_skipped": _perturb.skipped(names, _perturb.pinned_cap(options)),
        "divergence": None,
    }
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        report["verdict"] = "failed"
        report["exit_code"] = EXIT_RUN_FAILED
        return report
    baseline = outcomes[0]
    for other in outcomes[1:]:
        divergence = _compare.first_divergence(baseline.result, other.result)
        if divergence is None:
            continue
        report["divergence"] = {
            "runs": [baseline.setup.index, other.setup.index],
            **divergence.to_dict(),
            "description": _compare.describe(divergence),
            # Reported first: a setting that differs usually explains the bits.
            "profile_differences": {
                name: list(values)
                for name, values in Profile.from_dict(baseline.result["profile"])
                .differences(Profile.from_dict(other.result["profile"]))
                .items()
            },
        }
        if options.attribute:
            if progress is not None:
                progress(
                    f"[{device}] diverged; re-running to find the perturbation responsible"
                )
            report["divergence"]["attribution"] = _attribute(
                baseline, other, worker_spec, env, options.timeout, workdir
            )
        report["verdict"] = "diverged"
        report["exit_code"] = EXIT_DIVERGED
        return report
    report["verdict"] = "identical"
    report["exit_code"] = EXIT_OK
    return report


def check(options: CheckOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Runs the check and returns the full report (see `tfdet check --json`).

    Raises:
        ValueError: a bad option.
        TargetError: the TARGET cannot be built (before anything is spawned).
        DeviceUnavailableError: `device="gpu"` without a visible GPU.
    """
    _validate(options)
    _perturb.validate(options.perturb)  # Unknown or repeated names: ValueError.
    spec = preflight(options.target)
    devices: dict[str, Any] = {}
    gpu = _devices.gpu_visible() if options.device in ("gpu", "all") else False
    if options.device == "gpu" and not gpu:
        raise DeviceUnavailableError(
            "Expected a GPU for --device gpu. Received: no GPU visible to TensorFlow "
            f"({_devices.why_no_gpu()}). Use --device cpu, or run on a machine with a "
            "GPU and the tensorflow[and-cuda] build."
        )
    wanted = (
        ["cpu"]
        if options.device == "cpu"
        else ["gpu"]
        if options.device == "gpu"
        else ["cpu", "gpu"]
    )
    with tempfile.TemporaryDirectory(prefix="tfdet-check-") as workdir:
        for device in wanted:
            if device == "gpu" and not gpu:
                devices["gpu"] = {"status": "skipped", "reason": "no GPU visible"}
                continue
            device_dir = os.path.join(workdir, device)
            os.makedirs(device_dir)
            devices[device] = _check_device(device, options, spec, progress, device_dir)
    codes = [d["exit_code"] for d in devices.values() if d.get("status") == "ran"]
    exit_code = (
        EXIT_RUN_FAILED if EXIT_RUN_FAILED in codes else max(codes, default=EXIT_OK)
    )
    verdict = {
        EXIT_OK: "identical",
        EXIT_DIVERGED: "diverged",
        EXIT_RUN_FAILED: "failed",
    }[exit_code]
    return {
        "target": spec.text,
        "enable": options.enable,
        "seed": options.seed,
        "threads": options.threads,
        "runs": options.runs,
        "steps": options.steps,
        "devices": devices,
        "verdict": verdict,
        "exit_code": exit_code,
    }
