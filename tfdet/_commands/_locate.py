"""`tfdet locate`: the first layer whose bits differ between two processes.

Two fresh processes train TARGET under the perturbations of `tfdet check`
(`tfdet._protocol._perturb`, spawned by `tfdet._runner._spawn`), each running
`tfdet._child._locate_worker`, which fingerprints every layer's forward
output, the loss, the gradient flowing into every layer's output and every
variable's gradient, and the weights after the update, at every step;
`tfdet._record._layer_walk` finds where the two records part.

`record` runs one unperturbed process that writes its record as a trace
file instead (`tfdet locate --record FILE`): recorded on two machines, the
two files are compared by `tfdet diff`, down to the layer.

The step is tfdet's own `tf.GradientTape` replica of Keras's train step
(`compute_loss`, gradients, `optimizer.apply_gradients`), so that layer
outputs can be watched; metrics are not computed. Graph-mode
(`tf.compat.v1`) targets are refused: use `tfdet check` for them.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from tfdet._commands import _progress_lines
from tfdet._commands._locate_report import (
    LAYER_FIELDS,
    LocateReport,
    LocateRun,
    RecordReport,
)
from tfdet._commands._options import RunOptions, RunPlan
from tfdet._commands._progress_lines import ProgressFn
from tfdet._commands._report_common import result_of
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, Error, RunFailedError
from tfdet._protocol import _emulation, _perturb, _spec
from tfdet._protocol._result import LocateResult
from tfdet._record import _layer_walk
from tfdet._runner import _outcome, _preflight, _spawn


def _run(
    options: RunOptions,
    plan: RunPlan,
    progress: ProgressFn | None,
    on_step: _progress_lines.StepFn | None,
) -> list[_outcome.RunOutcome]:
    """Runs the locate worker in one process per setup; raises if one failed.

    Raises:
        TargetError: TARGET cannot be built.
        RunFailedError: a run crashed or timed out.
    """
    with tempfile.TemporaryDirectory(prefix="tfdet-locate-") as workdir:
        outcomes = _spawn.run_all(
            plan.setups,
            plan.spec,
            workdir,
            base_env=plan.environment,
            timeout=options.timeout,
            progress=_progress_lines.steps_to(progress, on_step, "cpu"),
        )
    _preflight.raise_unbuilt_target(outcomes, options.target_spec.text, options.timeout)
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        outcome = failed[0]
        raise RunFailedError(
            f"locate run {outcome.setup.index} failed ({outcome.reason}); stderr "
            f"tail:\n{outcome.stderr_tail}"
        )
    return outcomes


def record(
    options: RunOptions,
    path: str,
    progress: ProgressFn | None = None,
    on_step: _progress_lines.StepFn | None = None,
) -> RecordReport:
    """Trains TARGET in one unperturbed process that writes its layer record.

    The file is a trace (`tfdet._record._trace`) whose header also holds the
    layers and whose steps also hold each layer's fingerprints, written step
    by step: `tfdet diff` compares two of them (e.g. from two machines) and
    names the first layer that differs.

    Returns:
        The `RecordReport` (`to_dict()`: `--json`): target, steps, the
        record's path, its layers.

    Raises:
        TargetError: TARGET cannot be built.
        RunFailedError: the run crashed or timed out (the file then holds
            the steps recorded before).
    """
    path = os.path.abspath(path)
    # Layer fingerprints are taken on the CPU: GPUs are hidden.
    plan = options.plan(_spec.LOCATE, "cpu", runs=2, names=(), record=path)
    setup = plan.setups[0]
    if options.emulate_cpu is not None:
        # Recorded on an emulated CPU: `tfdet diff` against a native record
        # names the first layer whose bits follow the CPU.
        why = _emulation.why_unavailable(options.pinned_cap)
        if why is not None:
            raise Error(f"Expected to record on an emulated CPU. Received: {why}")
        setup = _perturb.emulated_setup(options.context(_spec.LOCATE, runs=2))
    (outcome,) = _run(
        options, dataclasses.replace(plan, setups=(setup,)), progress, on_step
    )
    result = result_of(outcome, LocateResult)
    return RecordReport(
        target=options.target_spec.text,
        enable=options.enable,
        steps=options.steps,
        record=path,
        # The CPU the recording run saw, when it was an emulated one.
        emulated=setup.labels.get(_perturb.EMULATED_CPU),
        profile=result.profile,
        layers=tuple(layer["name"] for layer in result.layers),
        seconds=round(outcome.seconds, 3),
    )


def locate(
    options: RunOptions,
    progress: ProgressFn | None = None,
    on_step: _progress_lines.StepFn | None = None,
) -> LocateReport:
    """Runs two perturbed processes and finds the first layer that differs.

    Of `options`, locate uses `target`, `steps`, `perturb`, `enable`, `seed`,
    `threads`, `cpu_isa` and `timeout`; it always runs two processes, on the
    CPU.

    Returns:
        The `LocateReport` (`to_dict()`: `--json`): target, options, the two
        runs' perturbations and profiles, the `location` (or None), the exit
        code.

    Raises:
        TargetError: TARGET cannot be built.
        RunFailedError: a run crashed or timed out.
    """
    names = list(options.perturb)
    plan = options.plan(_spec.LOCATE, "cpu", runs=2)
    outcomes = _run(options, plan, progress, on_step)
    results = [result_of(outcome, LocateResult) for outcome in outcomes]
    location = _layer_walk.locate_results(results[0], results[1])
    return LocateReport(
        target=options.target_spec.text,
        enable=options.enable,
        steps=options.steps,
        perturbations=tuple(names),
        perturbations_skipped=plan.skipped,
        runs=tuple(
            LocateRun(
                index=outcome.setup.index,
                perturbations=dict(outcome.setup.labels),
                profile=result.profile,
                seconds=round(outcome.seconds, 3),
            )
            for outcome, result in zip(outcomes, results, strict=True)
        ),
        layers=tuple(
            {key: layer[key] for key in LAYER_FIELDS} for layer in results[0].layers
        ),
        location=location,
        exit_code=EXIT_OK if location is None else EXIT_DIVERGED,
    )
