"""The human reports of `tfdet check` and `tfdet check --script`.

Both read the report dicts that `--json` writes (one source of truth: what a
person reads is what the JSON says), so a report of another tfdet version
formats too where it has the fields.
"""

from __future__ import annotations

from typing import Any

from tfdet._commands import _options
from tfdet._commands._report import control_line
from tfdet._errors import EXIT_OK


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
    if options.patches != (_options.DEFAULT_PATCHES,):
        mode += f" (patches: {', '.join(options.patches)})"
    return (
        f"tfdet check {options.target_spec.text} {mode}: {options.runs} runs"
        f"{_distribution(options.workers, options.replicas)} x "
        f"{options.steps} steps on {options.device}; perturbations: "
        f"{', '.join(options.perturb) or 'none'}"
    )


def _ran_lines(run: dict[str, Any]) -> list[str]:
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


def _unpinned_xla_isa(runs: list[dict[str, Any]]) -> list[str]:
    """Once per device: XLA-compiled runs whose XLA:CPU ISA could not be capped."""
    xla_on = any((run.get("xla") or {}).get("on") for run in runs)
    reasons = {(run.get("profile") or {}).get("xla_cpu_isa") or "" for run in runs}
    return [
        f"  XLA:CPU ISA cap not applied: {reason}"
        for reason in sorted(reasons)
        if xla_on and reason.startswith("none (")
    ]


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    """The control's sentence (with `--control`), then the verdict."""
    control = control_line(
        report.get("control"),
        report["verdict"],
        # A TARGET's report: imitated and varied; a script's: perturbations.
        [
            *report.get("imitated", ()),
            *report.get("varied", ()),
            *report.get("perturbations", ()),
        ],
        report.get("patches", ()),
    )
    verdict = f"verdict: {report['verdict']} (exit {report['exit_code']})"
    return [verdict] if control is None else [control, verdict]


def _cause_lines(attribution: dict[str, Any] | None) -> list[str]:
    """The perturbation responsible for a divergence, and each one alone."""
    if not attribution:
        return []
    return [f"  cause: {attribution['verdict']}"] + [
        f"    {name} alone: {outcome}" for name, outcome in attribution["alone"].items()
    ]


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
            lines.extend(_ran_lines(run))
            for what in run.get("nonfinite") or []:
                nonfinite = True
                lines.append(f"    not finite: {what}")
            if run.get("trace") and report.get("traces"):
                lines.append(f"    trace: {run['trace']}")
        lines.extend(_xla_notice(result["runs"]))
        lines.extend(_unpinned_xla_isa(result["runs"]))
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
            lines.extend(_cause_lines(divergence.get("attribution")))
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
    varied_names = ", ".join(report.get("varied") or {})
    varied = (
        f"; also varied (not another machine): {varied_names}" if varied_names else ""
    )
    lines.append(
        f"imitated other machines on this one by: {imitated}{emulated}{varied}; "
        f"not imitated: {not_imitated} (compare traces from two real machines "
        "with tfdet diff)"
    )
    lines.extend(_verdict_lines(report))
    return "\n".join(lines)


def format_script_report(report: dict[str, Any]) -> str:
    """The human report of `tfdet check --script` (`check_script`'s report)."""
    mode = _options.mode_label(report["enable"])
    args = " ".join(report["args"])
    lines = [
        f"tfdet check --script {report['script']}{' ' + args if args else ''} "
        f"{mode}: {report['runs']} runs"
        + (f", at most {report['max_steps']} steps" if report["max_steps"] else "")
    ]
    for run in report["run_reports"]:
        labels = "; ".join(run["perturbations"].values()) or "no perturbation"
        if run["ok"]:
            xla = "XLA on" if run["xla"]["on"] else "XLA off"
            ran = ", ".join(run["entry_points"]) or "no training"
            keras = " and ".join(run["keras"]) or "no Keras model"
            lines.append(
                f"  run {run['index']} (script {run['end']}, {run['seconds']:.1f}s): "
                f"{run['steps_recorded']} steps via {ran}; {keras}; {xla}; {labels}"
            )
            for training in run["trainings"]:
                updates = training.get("updates")
                counted = (
                    f"{updates} updates in a tf.function, final weights compared"
                    if "updates" in training
                    else f"{training['steps']} steps"
                )
                lines.append(f"    {training['name']}: {counted}")
        else:
            lines.append(
                f"  run {run['index']} failed ({run['reason']}); {labels}; stderr tail:"
            )
            lines.extend(f"    {line}" for line in run["stderr_tail"].splitlines())
    for name, reason in report["perturbations_skipped"].items():
        lines.append(f"  perturbation {name} not applied: {reason}")
    for notice in report["notices"]:
        lines.append(f"  {notice}")
    divergence = report["divergence"]
    if report.get("shared_writes"):
        lines.append(
            "  files the runs all share (linked, not copied, into each run's "
            "directory) changed while they ran: "
            + ", ".join(report["shared_writes"])
            + ". A run wrote them, or another process did (a log another job "
            "appends to, say): either way the runs were not isolated from them. "
            "Have the script write new files (or under a path it takes as an "
            "argument), or keep other writers away during the check"
        )
    elif divergence:
        a, b = divergence["runs"]
        lines.append(
            f"  first divergence (run {a} vs run {b}): {divergence['description']}"
        )
        lines.extend(_cause_lines(divergence.get("attribution")))
    elif report["nothing_trained"]:
        lines.append(
            "  the script trained nothing tfdet could record (no step of fit or "
            "train_on_batch, no optimizer update): nothing was compared"
        )
    elif report["exit_code"] == EXIT_OK:
        lines.append(
            f"  every recorded step and final weight bit identical across "
            f"{len(report['run_reports'])} runs"
        )
    lines.extend(_verdict_lines(report))
    return "\n".join(lines)
