"""Find the first layer whose output or gradient bits differ between two runs.

Trains TARGET in two fresh processes perturbed as `tfdet check` does,
fingerprinting at every step each layer's forward output, the loss, the
gradient reaching each layer and each variable's gradient. Reports the first
layer, in execution order, whose bits differ at the first diverging step,
with the TensorFlow op types inside it.

Across machines: `tfdet locate TARGET --record FILE` trains TARGET in one
unperturbed process and writes the same fingerprints to FILE, a trace that
`tfdet diff A B` compares down to the layer. Record on each machine, then
diff the two files anywhere.

Exit codes: 0 no layer differs (with --record: recorded), 1 a layer differs,
2 bad input, 3 a run failed or timed out.
"""

from __future__ import annotations

import argparse
from typing import Any

from tfdet._cli import (
    _check_text,
    _output,
    _training_flags,
    as_flags,
    check_output_file,
    write_json,
)
from tfdet._commands import _locate
from tfdet._commands._locate_report import LocateReport, RecordReport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _training_flags.add(parser)
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="Train once, unperturbed (--perturb does not apply), and write every "
        "step's layer fingerprints to FILE as a trace; `tfdet diff A B` of two "
        "records (e.g. from two machines) names the first layer that differs.",
    )


def format_report(report: LocateReport) -> str:
    """The human report: runs, then the layer where the bits part."""
    mode = _check_text.mode_label(report.enable)
    lines = [f"tfdet locate {report.target} {mode}: 2 runs x {report.steps} steps"]
    for run in report.runs:
        labels = "; ".join(run.perturbations.values()) or "no perturbation"
        lines.append(f"  run {run.index} ({run.seconds:.1f}s): {labels}")
    for name, reason in report.perturbations_skipped.items():
        lines.append(f"  perturbation {name} not applied: {reason}")
    if report.location is None:
        lines.append(
            f"no difference: every layer output, gradient and weight is bit-identical "
            f"in all {report.steps} steps ({len(report.layers)} layers)."
        )
        return "\n".join(lines)
    return "\n".join(lines + location_lines(report.location.to_dict()))


def location_lines(location: dict[str, Any]) -> list[str]:
    """Where the bits part (a `Location` dict), as `locate` and `diff` show it."""
    lines = [f"first diverging step: {location['step']} ({location['phase']} pass)"]
    if location["layer"] is None:
        lines.append(f"  first difference: the {location['quantity']}")
    else:
        lines.append(
            f"  first layer that differs: {location['layer']} ({location['layer_class']}), "
            f"{location['quantity']}"
        )
        lines.append(f"  name scope: {location['scope']}")
        lines.append(
            f"  TensorFlow ops (forward): {', '.join(location['ops']) or '(none)'}"
        )
        lines.append(
            f"  TensorFlow ops (gradient): {', '.join(location['gradient_ops']) or '(none)'}"
        )
    if location["agreeing"]:
        lines.append(f"  bit-identical before it: {', '.join(location['agreeing'])}")
    return lines


def format_record_report(report: RecordReport) -> str:
    """The human report of `--record`: what was written, and what to do next."""
    mode = _check_text.mode_label(report.enable)
    return (
        f"tfdet locate {report.target} {mode}: recorded {report.steps} steps "
        f"of {len(report.layers)} layers ({report.seconds:.1f}s) to "
        f"{report.record}"
        + (f" on {report.emulated}" if report.emulated else "")
        + "\nRecord on another machine and compare: tfdet diff "
        "A B names the first layer that differs."
    )


def execute(args: argparse.Namespace) -> int:
    options = _training_flags.options(args)
    check_output_file(args.record, "--record")
    # Before anything starts: TensorFlow takes seconds to start in the runs.
    if args.record:
        plan = f"1 run x {options.steps} steps, recording to {args.record}"
    else:
        plan = (
            f"2 runs x {options.steps} steps; perturbations: "
            f"{', '.join(options.perturb) or 'none'}"
        )
    _output.progress(
        f"tfdet locate {options.target_spec.text}: {plan}; starting TensorFlow"
    )
    # Steps go to the display as check's do; layer fingerprints are taken
    # on the CPU.
    display = _output.StepsDisplay()
    report: LocateReport | RecordReport
    try:
        if args.record:
            report = _locate.record(options, args.record, display.message, display.step)
        else:
            report = _locate.locate(options, display.message, display.step)
    finally:
        display.finish()
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, report.to_dict())
    if isinstance(report, RecordReport):
        # An emulated run's label names `timeout` the Python way: say the flag.
        _output.out(as_flags(format_record_report(report)))
    else:
        _output.out(format_report(report))
    return report.exit_code
