"""Find the first layer whose output or gradient bits differ between two runs.

Trains TARGET in two fresh processes perturbed as `tfdet check` does,
fingerprinting at every step each layer's forward output, the loss, the
gradient reaching each layer and each variable's gradient. Reports the first
layer, in execution order, whose bits differ at the first diverging step,
with the TensorFlow op types inside it.

Exit codes: 0 no layer differs, 1 a layer differs, 2 bad input, 3 a run failed
or timed out.
"""

from __future__ import annotations

import argparse
from typing import Any

from tfdet._cli import _output, _training_flags, write_json
from tfdet._runs import _locate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _training_flags.add(parser)


def format_report(report: dict[str, Any]) -> str:
    """The human report: runs, then the layer where the bits part."""
    mode = "with tfdet.enable()" if report["enable"] else "without tfdet (--no-enable)"
    lines = [
        f"tfdet locate {report['target']} {mode}: 2 runs x {report['steps']} steps"
    ]
    for run in report["runs"]:
        labels = "; ".join(run["perturbations"].values()) or "no perturbation"
        lines.append(f"  run {run['index']} ({run['seconds']:.1f}s): {labels}")
    for name, reason in report["perturbations_skipped"].items():
        lines.append(f"  perturbation {name} not applied: {reason}")
    location = report["location"]
    if location is None:
        lines.append(
            f"no difference: every layer output, gradient and weight is bit-identical "
            f"in all {report['steps']} steps ({len(report['layers'])} layers)."
        )
        return "\n".join(lines)
    lines.append(f"first diverging step: {location['step']} ({location['phase']} pass)")
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
    return "\n".join(lines)


def execute(args: argparse.Namespace) -> int:
    options = _training_flags.options(args)
    # Before anything starts: TensorFlow takes seconds to start in the runs.
    _output.progress(
        f"tfdet locate {options.target_spec.text}: 2 runs x {options.steps} steps; "
        f"perturbations: {', '.join(options.perturb) or 'none'}; starting TensorFlow"
    )
    display = _output.StepsDisplay()
    try:  # Layer fingerprints are taken on the CPU.
        report = _locate.locate(options, _training_flags.routed(display, "cpu"))
    finally:
        display.finish()
    # The file first: a closed stdout must not lose the machine-readable report.
    write_json(args.json, report)
    _output.out(format_report(report))
    return report["exit_code"]
