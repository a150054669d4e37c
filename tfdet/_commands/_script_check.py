"""`tfdet check --script`: is a user's training script, as it is, repeatable?

The script runs unchanged, whole, in N fresh processes started together under
the perturbations of `tfdet check` (`tfdet._protocol._perturb`), each the way
`tfdet run` runs a script: environment pinned, `tfdet.enable()` first (unless
`enable=False`), `sys.argv` set. Recording hooks (`_script_hooks`) trace
every `fit` call, every model's `train_on_batch` calls and every custom loop's
eager optimizer updates. The runs' traces are compared step by step as
`tfdet diff` compares traces (`tfdet._record._diff.first_divergence`), then every
variable's final digest. A run whose script fails is exit 3 with its exit
status and stderr tail; identical runs are exit 0; the first difference is
exit 1, naming the training (which fit call or loop), the step and the
quantity.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Sequence

from tfdet._commands import _progress_lines
from tfdet._commands._check_report import (
    Attribution,
    attribution_verdict,
    responsible_of,
)
from tfdet._commands._options import RunOptions
from tfdet._commands._progress_lines import ProgressFn
from tfdet._commands._report_common import ProcessFacts, control_of, result_of
from tfdet._commands._script_report import (
    ScriptCheckReport,
    ScriptDivergence,
    ScriptRunReport,
    ScriptTraining,
)
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_RUN_FAILED, TraceFormatError
from tfdet._pin import _isa, _settings
from tfdet._protocol import _perturb, _spec
from tfdet._protocol._result import ScriptResult
from tfdet._record import _diff, _trace
from tfdet._runner import _isolation, _outcome, _process, _spawn, _workdir
from tfdet._setup import _enable
from tfdet._target import _load


@dataclasses.dataclass(frozen=True)
class ScriptOptions:
    """What `tfdet check --script` runs, and how.

    Attributes:
        script: Path of the training script.
        args: Its command-line arguments.
        run: The shared run options (runs, perturb, enable, seed, threads,
            cpu_isa, timeout; `target` and `steps` are unused).
        max_steps: Stop each run after this many recorded training steps
            (None: let the script finish).
        overlay: Give each run an overlay of the working directory where
            this machine allows (`_isolation`); False: copies.

    Raises:
        ValueError: no such script, or `max_steps` < 1.
    """

    script: str
    args: tuple[str, ...] = ()
    run: RunOptions = dataclasses.field(default_factory=RunOptions)
    max_steps: int | None = None
    overlay: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.script, str) or not os.path.isfile(self.script):
            raise ValueError(
                f"Expected `script` to name a Python script. No such file: "
                f"{self.script!r}"
            )
        if self.max_steps is not None and (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or self.max_steps < 1
        ):
            raise ValueError(
                f"Expected `max_steps` to be an int >= 1. Received: "
                f"max_steps={self.max_steps!r}"
            )


# The attribution's key for the re-run of the baseline's own settings.
RERUN = "re-run"


def _environment(options: ScriptOptions) -> dict[str, str]:
    """The runs' environment: `tfdet run`'s pins, the script's Keras choice."""
    run = options.run
    legacy = _load.sets_legacy_keras(options.script)
    env = _process.run_environment(
        _load.TargetSpec("script", legacy_keras=legacy), "cpu"
    )
    if run.enable:
        env.update(
            _enable.pinned_environment(
                run.seed,
                run.threads,
                run.cpu_isa if _isa.applies() else None,
                _settings.DEFAULT_ONEDNN,
            )
        )
    return env


@dataclasses.dataclass
class _ScriptRun:
    outcome: _outcome.RunOutcome
    traces: list[_trace.Trace | None]

    @property
    def result(self) -> ScriptResult:
        """What a finished run (`outcome.ok`) wrote."""
        return result_of(self.outcome, ScriptResult)


def _read(outcome: _outcome.RunOutcome) -> _ScriptRun:
    traces: list[_trace.Trace | None] = []
    if outcome.ok:
        try:
            for entry in result_of(outcome, ScriptResult).traces:
                traces.append(_trace.read(entry["trace"]) if entry["trace"] else None)
        except TraceFormatError as error:
            outcome = dataclasses.replace(
                outcome, result=None, failure=f"a trace is unreadable ({error})"
            )
    return _ScriptRun(outcome, traces)


def first_script_divergence(a: _ScriptRun, b: _ScriptRun) -> ScriptDivergence | None:
    """The first difference between two finished runs, or None."""
    runs = (a.outcome.setup.index, b.outcome.setup.index)
    entries_a, entries_b = a.result.traces, b.result.traces
    names_a = [e["name"] for e in entries_a]
    names_b = [e["name"] for e in entries_b]
    for k, (ta, tb) in enumerate(zip(a.traces, b.traces, strict=False)):
        if names_a[k] != names_b[k]:
            break
        if ta is None or tb is None:
            if (ta is None) != (tb is None):
                return ScriptDivergence(
                    training=names_a[k],
                    found={},
                    description=f"{names_a[k]}: recorded steps in only one run",
                    runs=runs,
                )
            continue
        divergence = _diff.first_divergence(ta, tb)
        if divergence is not None:
            return ScriptDivergence(
                training=names_a[k],
                found=divergence.to_dict(),
                description=f"{names_a[k]}: {divergence.describe()}",
                runs=runs,
            )
    if names_a != names_b:
        return ScriptDivergence(
            training=None,
            found={"quantity": "trainings", "a": names_a, "b": names_b},
            description=f"the runs trained differently: {names_a} vs {names_b}",
            runs=runs,
        )
    finals_a = a.result.final_weights
    finals_b = b.result.final_weights
    for entry in entries_a:
        name = entry["name"]
        for variable, digest in finals_a.get(name, {}).items():
            other = finals_b.get(name, {}).get(variable)
            if digest != other:
                why = (
                    "every recorded step agreed"
                    if entry["steps"]
                    else "its steps run in a tf.function and were not recorded"
                )
                return ScriptDivergence(
                    training=name,
                    found={
                        "quantity": f"final weights:{variable}",
                        "a": digest,
                        "b": other,
                    },
                    description=f"{name}: final weights of {variable} differ ({why})",
                    runs=runs,
                )
    return None


def _attribute(
    baseline: _ScriptRun,
    other: _ScriptRun,
    run_isolated: Callable[[Sequence[_perturb.RunSetup]], list[_ScriptRun]],
    progress: ProgressFn | None,
) -> Attribution:
    """Re-runs the baseline with each of `other`'s perturbations alone.

    As a TARGET's check does: the perturbations whose run alone differs from
    the baseline are responsible; a re-run of the baseline's own settings
    that differs makes the script nondeterministic by itself.
    """
    candidates, setups = zip(
        *baseline.outcome.setup.one_at_a_time(other.outcome.setup), strict=True
    )
    if progress is not None:
        progress(
            f"diverged; re-running the script in {len(setups)} processes at once "
            "to find the perturbation responsible"
        )
    alone: dict[str, str] = {}
    for name, rerun in zip(candidates, run_isolated(setups), strict=True):
        key = RERUN if name is None else name
        if not rerun.outcome.ok:
            alone[key] = f"run failed ({rerun.outcome.reason})"
        elif first_script_divergence(baseline, rerun) is None:
            alone[key] = "same bits"
        else:
            alone[key] = "differs"
    return Attribution(
        alone=alone,
        responsible=tuple(responsible_of(alone, RERUN)),
        verdict=attribution_verdict(alone, RERUN, "script"),
    )


def _run_report(run: _ScriptRun) -> ScriptRunReport:
    outcome = run.outcome
    if not outcome.ok:
        return ScriptRunReport(
            ProcessFacts.of(outcome), stderr_tail=outcome.stderr_tail
        )
    result = run.result
    return ScriptRunReport(
        ProcessFacts.of(outcome),
        trained=ScriptTraining(
            end=result.end,
            entry_points=result.entry_points,
            keras=result.keras,
            steps_recorded=result.steps_recorded,
            trainings=result.traces,
            xla=result.xla,
            own_copies=result.own_copies,
            spawned=result.spawned,
        ),
    )


def _trained(run: _ScriptRun) -> bool:
    """Whether a finished run recorded a step or an optimizer update."""
    return any(entry["steps"] or entry.get("updates") for entry in run.result.traces)


def check_script(
    options: ScriptOptions, progress: ProgressFn | None = None
) -> ScriptCheckReport:
    """Runs the script N times and returns the report (`to_dict()`: `--json`).

    With `options.run.control`, the same runs follow without tfdet, and the
    report says what they found (`ScriptCheckReport.control`).
    """
    run = options.run
    launched_in = os.getcwd()
    # Inside the directory the check was started in, the script runs from
    # each run's mirror of it (a relative path resolves there).
    relative = _workdir.inside(options.script, launched_in)
    # sys.path[0], as `python` puts it: the real file's directory (a linked
    # script's sibling modules lie there), in the run's mirror when inside.
    real_directory = os.path.dirname(os.path.realpath(options.script))
    plan = run.plan(
        _spec.SCRIPT,
        environment=_environment(options),
        script=relative or os.path.abspath(options.script),
        script_dir=_workdir.inside(real_directory, os.path.realpath(launched_in))
        or real_directory,
        args=options.args,
        max_steps=options.max_steps,
    )
    setups = plan.setups

    with tempfile.TemporaryDirectory(prefix="tfdet-script-") as workdir:
        isolation = _isolation.choose(launched_in, workdir, overlay=options.overlay)
        if progress is not None:
            progress(
                f"{len(setups)} runs: "
                + (
                    "each in an overlay of its own of "
                    if isolation.kind == _isolation.OVERLAY
                    else "giving each a copy of "
                )
                + launched_in
            )
        placements: list[_isolation.Placement] = []

        def run_isolated(planned: Sequence[_perturb.RunSetup]) -> list[_ScriptRun]:
            placement = _isolation.place(isolation, launched_in, workdir, planned)
            placements.append(placement)
            outcomes = _spawn.run_all(
                planned,
                plan.spec,
                workdir,
                base_env=plan.environment,
                timeout=run.timeout,
                progress=_progress_lines.step_lines(progress, "script"),
                directory=placement.directory,
                prefix=placement.prefix,
            )
            return [_read(outcome) for outcome in outcomes]

        runs = run_isolated(setups)
        divergence = None
        if all(r.outcome.ok for r in runs):
            for other in runs[1:]:
                divergence = first_script_divergence(runs[0], other)
                if divergence is not None:
                    if run.attribute:
                        divergence = dataclasses.replace(
                            divergence,
                            attribution=_attribute(
                                runs[0], other, run_isolated, progress
                            ),
                        )
                    break
        shared = sorted({path for p in placements for path in p.shared_writes()})
    finished = all(r.outcome.ok for r in runs)
    nothing_trained = finished and not any(_trained(r) for r in runs)
    if not finished or shared or nothing_trained:
        # Nothing trained, nothing compared: not a verdict of equality. (A
        # loop whose step is a tf.function records no step, only its
        # optimizer's updates and final weights: those are compared.)
        code = EXIT_RUN_FAILED
    else:
        code = EXIT_DIVERGED if divergence else EXIT_OK
    reports = tuple(_run_report(r) for r in runs)
    trained = [report.trained for report in reports if report.trained is not None]
    xla_notices = (each.xla.get("notice") for each in trained)
    notices = {notice for notice in xla_notices if notice is not None} | {
        f"{path}: outside the runs' directories, so each run kept its own copy "
        "(training state a resume reads back)"
        for each in trained
        for path in each.own_copies
    }
    report = ScriptCheckReport(
        script=options.script,
        args=tuple(options.args),
        enable=run.enable,
        seed=run.seed,
        threads=run.threads,
        runs_per_check=run.runs,
        max_steps=options.max_steps,
        perturbations=tuple(run.perturb),
        perturbations_skipped={
            **plan.skipped,
            # Given, but a run could not apply it (e.g. no backup to resume).
            **{
                name: reason
                for r in runs
                for name, reason in r.outcome.unapplied.items()
            },
        },
        run_reports=reports,
        divergence=divergence,
        nothing_trained=nothing_trained,
        # Files outside the runs' own directories that the runs changed:
        # they shared them, so their bits were not compared in isolation.
        shared_writes=tuple(shared),
        isolation=isolation.describe(),
        notices=tuple(sorted(notices)),
        exit_code=code,
    )
    if not run.control:
        return report
    if progress is not None:
        progress("control: the same runs and perturbations without tfdet")
    plain = check_script(
        dataclasses.replace(options, run=run.without_tfdet()), progress
    )
    return dataclasses.replace(report, control=control_of(plain))
