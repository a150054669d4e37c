"""The human reports of `tfdet check` and `tfdet check --script`.

Both are formatted from the typed reports that `--json` writes
(`CheckReport`, `ScriptCheckReport`): what a person reads is what the JSON
says.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfdet._commands import _options
from tfdet._commands._check_report import (
    Attribution,
    CheckReport,
    DeviceReport,
    RunReport,
    Training,
)
from tfdet._commands._report_common import control_line
from tfdet._commands._script_report import ScriptCheckReport, ScriptRunReport
from tfdet._errors import EXIT_OK
from tfdet._setup import _coverage


def mode_label(enable: bool) -> str:
    """How the CLI's reports name whether the runs called `tfdet.enable()`."""
    return "with tfdet.enable()" if enable else "without tfdet (--no-enable)"


def _labels(perturbations: dict[str, str]) -> str:
    return "; ".join(perturbations.values()) or "no perturbation"


def _run_line(run: RunReport) -> str:
    facts = run.facts
    if facts.ok:
        loss = run.training.final_loss if run.training else None
        state = "ok" if loss is None else f"ok, final loss {loss}"
    else:
        state = facts.reason or "failed"
    return f"  {facts.name} ({state}, {facts.seconds:.1f}s): {_labels(facts.perturbations)}"


def _distribution(workers: int, replicas: int) -> str:
    if workers > 1:
        return f" ({workers} workers each, MultiWorkerMirroredStrategy on loopback)"
    if replicas > 1:
        return f" ({replicas} replicas each, MirroredStrategy on logical CPUs)"
    return ""


def format_header(options: _options.RunOptions) -> str:
    """What is about to run: printed before anything starts."""
    mode = mode_label(options.enable)
    if options.patches != (_options.DEFAULT_PATCHES,):
        mode += f" (patches: {', '.join(options.patches)})"
    return (
        f"tfdet check {options.target_spec.text} {mode}: {options.runs} runs"
        f"{_distribution(options.workers, options.replicas)} x "
        f"{options.steps} steps on {options.device}; perturbations: "
        f"{', '.join(options.perturb) or 'none'}"
    )


def _ran_lines(run: RunReport) -> list[str]:
    """What a finished run exercised: entry point, steps, XLA (and why not),
    and the pool it trained with (under the default, each run's own CPUs)."""
    training = run.training
    if not run.ok or training is None or training.xla is None:
        return []
    ran = ", ".join(training.entry_points or []) or "nothing"
    pool = training.profile.get("intra_op_threads") if training.profile else None
    return [
        f"    ran: {training.steps_recorded} steps via {ran}; "
        f"XLA {'on' if training.xla.get('on') else 'off'}"
        + (f"; pool of {pool} thread{'s' * (pool != 1)}" if pool else "")
    ]


def _trainings(runs: Iterable[RunReport]) -> list[Training]:
    return [run.training for run in runs if run.training is not None]


def _xla_notice(runs: tuple[RunReport, ...]) -> list[str]:
    """Once per device: Keras dropped the user's jit_compile=True."""
    notices = {(t.xla or {}).get("notice") for t in _trainings(runs)}
    return [f"  {notice}" for notice in sorted(n for n in notices if n is not None)]


def _coverage_lines(runs: tuple[RunReport, ...]) -> list[str]:
    """Once per device: the ops the runs traced that tfdet does not cover,
    and the tiers they take (nothing where every op is covered)."""
    coverage = _coverage.Coverage.merged(
        _coverage.Coverage.from_dict(t.coverage) for t in _trainings(runs) if t.coverage
    )
    return [f"  {coverage.describe()}"] if coverage.uncovered else []


def _unpinned_xla_isa(runs: tuple[RunReport, ...]) -> list[str]:
    """Once per device: XLA-compiled runs whose XLA:CPU ISA could not be capped."""
    trainings = _trainings(runs)
    xla_on = any((t.xla or {}).get("on") for t in trainings)
    reasons = {(t.profile or {}).get("xla_cpu_isa") or "" for t in trainings}
    return [
        f"  XLA:CPU ISA cap not applied: {reason}"
        for reason in sorted(reasons)
        if xla_on and reason.startswith("none (")
    ]


def _verdict_lines(
    report: CheckReport | ScriptCheckReport,
    perturbations: Iterable[str],
    patches: Iterable[str] = (),
) -> list[str]:
    """The control's sentence (with `--control`), then the verdict."""
    control = control_line(report.control, report.verdict, perturbations, patches)
    verdict = f"verdict: {report.verdict} (exit {report.exit_code})"
    return [verdict] if control is None else [control, verdict]


def _cause_lines(attribution: Attribution | None) -> list[str]:
    """The perturbation responsible for a divergence, and each one alone."""
    if attribution is None:
        return []
    return [f"  cause: {attribution.verdict}"] + [
        f"    {name} alone: {outcome}" for name, outcome in attribution.alone.items()
    ]


def _device_lines(result: DeviceReport, traces: bool) -> list[str]:
    """A device that ran: its runs, what they did not apply, what differs."""
    lines = []
    nonfinite = False
    for run in result.runs:
        lines.append(_run_line(run))
        lines.extend(_ran_lines(run))
        training = run.training
        for what in training.nonfinite if training else ():
            nonfinite = True
            lines.append(f"    not finite: {what}")
        if training and training.trace and traces:
            lines.append(f"    trace: {training.trace}")
    lines.extend(_xla_notice(result.runs))
    lines.extend(_coverage_lines(result.runs))
    lines.extend(_unpinned_xla_isa(result.runs))
    for name, reason in result.perturbations_skipped.items():
        lines.append(f"  perturbation {name} not applied: {reason}")
    if result.verdict == "failed":
        for run in result.runs:
            if not run.ok:
                lines.append(
                    f"  {run.facts.name} failed ({run.facts.reason}); stderr tail:"
                )
                lines.extend(
                    f"    {line}" for line in (run.stderr_tail or "").splitlines()
                )
    divergence = result.divergence
    if divergence is not None:
        a, b = divergence.run_names()
        for name, (left, right) in divergence.profile_differences.items():
            lines.append(
                f"  profile differs (run {a} vs run {b}): {name}: {left} vs {right}"
            )
        lines.append(
            f"  first divergence (run {a} vs run {b}): {divergence.description}"
        )
        lines.extend(_cause_lines(divergence.attribution))
    elif result.verdict == "identical":
        across = f"{len(result.runs)} runs"
        if result.workers > 1:
            across = (
                f"{len(result.runs) // result.workers} runs x {result.workers} workers"
            )
        lines.append(f"  every loss, metric and weight bit identical across {across}")
        if nonfinite:
            lines.append(
                "  but the training produced NaN or Inf (above): identical bits "
                "of a broken training prove little; fix the model or data first"
            )
    return lines


def format_report(report: CheckReport) -> str:
    """The short human report: per device, runs, perturbations, verdict."""
    mode = mode_label(report.enable)
    lines = [
        f"tfdet check {report.target} {mode}: {report.runs_per_device} runs"
        f"{_distribution(report.workers, report.replicas)} x {report.steps} steps"
    ]
    for device, result in report.devices.items():
        if not result.ran:
            lines.append(f"{device.upper()}: skipped, {result.reason}")
            continue
        lines.append(f"{device.upper()}: {str(result.verdict).upper()}")
        lines.extend(_device_lines(result, report.traces is not None))
    imitated = ", ".join(report.imitated) or "nothing"
    not_imitated = ", ".join(name.replace("_", " ") for name in report.not_imitated)
    emulated = "".join(
        f"; emulated: {text.split(':')[0]}" for text in report.emulated.values()
    )
    varied_names = ", ".join(report.varied)
    varied = (
        f"; also varied (not another machine): {varied_names}" if varied_names else ""
    )
    lines.append(
        f"imitated other machines on this one by: {imitated}{emulated}{varied}; "
        f"not imitated: {not_imitated} (compare traces from two real machines "
        "with tfdet diff)"
    )
    lines.extend(
        _verdict_lines(report, [*report.imitated, *report.varied], report.patches)
    )
    return "\n".join(lines)


def _script_run_lines(run: ScriptRunReport, enable: bool) -> list[str]:
    facts, trained = run.facts, run.trained
    labels = _labels(facts.perturbations)
    if trained is None:
        return [
            f"  run {facts.index} failed ({facts.reason}); {labels}; stderr tail:",
            *(f"    {line}" for line in (run.stderr_tail or "").splitlines()),
        ]
    xla = "XLA on" if trained.xla["on"] else "XLA off"
    ran = ", ".join(trained.entry_points) or "no training"
    keras = " and ".join(trained.keras) or "no Keras model"
    lines = [
        f"  run {facts.index} (script {trained.end}, {facts.seconds:.1f}s): "
        f"{trained.steps_recorded} steps via {ran}; {keras}; {xla}; {labels}"
    ]
    for training in trained.trainings:
        counted = (
            f"{training['updates']} updates in a tf.function, final weights compared"
            if "updates" in training
            else f"{training['steps']} steps"
        )
        lines.append(f"    {training['name']}: {counted}")
    if trained.spawned:
        enabled = (
            "each enabled with the run's settings"
            if enable
            else "without tfdet, as the run"
        )
        lines.append(
            f"    started {trained.spawned} process"
            f"{'es' if trained.spawned != 1 else ''} with multiprocessing "
            f"(spawn or forkserver), {enabled}; what they trained is not "
            "recorded: only this process's training is compared"
        )
    return lines


def format_script_report(report: ScriptCheckReport) -> str:
    """The human report of `tfdet check --script` (`check_script`'s report)."""
    mode = mode_label(report.enable)
    args = " ".join(report.args)
    lines = [
        f"tfdet check --script {report.script}{' ' + args if args else ''} "
        f"{mode}: {report.runs_per_check} runs"
        + (f", at most {report.max_steps} steps" if report.max_steps else "")
    ]
    for run in report.run_reports:
        lines.extend(_script_run_lines(run, report.enable))
    if report.isolation:
        lines.append(f"  {report.isolation}")
    for name, reason in report.perturbations_skipped.items():
        lines.append(f"  perturbation {name} not applied: {reason}")
    for notice in report.notices:
        lines.append(f"  {notice}")
    divergence = report.divergence
    if report.shared_writes:
        lines.append(
            "  files the runs all share (linked into each run's copy, or beside "
            "the working directory) changed while they ran: "
            + ", ".join(report.shared_writes)
            + ". A run wrote them, or another process did (a log another job "
            "appends to, say): either way the runs were not isolated from them. "
            "Have the script write new files (or under a path it takes as an "
            "argument), or keep other writers away during the check"
        )
    elif divergence is not None:
        a, b = divergence.runs
        lines.append(
            f"  first divergence (run {a} vs run {b}): {divergence.description}"
        )
        lines.extend(_cause_lines(divergence.attribution))
    elif report.nothing_trained:
        lines.append(
            "  the script trained nothing tfdet could record (no step of fit or "
            "train_on_batch, no optimizer update): nothing was compared"
        )
    elif report.exit_code == EXIT_OK:
        lines.append(
            f"  every recorded step and final weight bit identical across "
            f"{len(report.run_reports)} runs"
        )
    lines.extend(_verdict_lines(report, report.perturbations))
    return "\n".join(lines)
