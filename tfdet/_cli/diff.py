"""Compare two step traces: first diverging step and quantity.

Compares two traces written by tfdet.DeterminismCallback (or kept by `tfdet
check --traces`, or recorded by `tfdet locate --record`). Prints the profile
fields and environment facts that differ (they usually explain the bits),
then the first step and quantity whose bits differ; for two `locate --record`
traces, also the first layer that differs and the TensorFlow ops inside it.

Exit codes: 0 every step is bit-identical, 1 the traces differ, 2 a file is not
a readable trace or neither trace holds a step (nothing compared is not
equality).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from absl import app

from tfdet._cli import _output, locate, write_json
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_USAGE
from tfdet._record import _diff, _plot, _trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="The expected trace (reference).")
    parser.add_argument("b", metavar="B", help="The trace to compare with A.")
    parser.add_argument("--json", metavar="FILE", help="Also write the report as JSON.")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="Also draw, per step, the ulp distance of the loss and metrics and "
        "which weight fingerprints differ, first divergence marked (needs "
        "matplotlib: pip install 'tfdet[plot]').",
    )


def _pairs(title: str, differences: dict[str, tuple[Any, Any]]) -> list[str]:
    if not differences:
        return [f"{title}: same"]
    lines = [f"{title} that differ (A vs B):"]
    lines.extend(f"  {name}: {a!r} vs {b!r}" for name, (a, b) in differences.items())
    return lines


def format_comparison(comparison: _diff.TraceComparison) -> str:
    """Human-readable report, explanations first."""
    lines = _pairs("profile fields", comparison.profile_differences)
    lines += _pairs("environment facts", comparison.fingerprint_differences)
    if comparison.distribution_differences:
        # Only traces of distributed runs have these facts.
        lines += _pairs("tf.distribute facts", comparison.distribution_differences)
    if comparison.cpu_differences:
        lines.append("CPU facts that differ, and whether they change bits:")
        lines.extend(
            f"  {fact}: {d['a']!r} vs {d['b']!r}: {d['changes_bits']} ({d['why']})"
            for fact, d in comparison.cpu_differences.items()
        )
    if comparison.variables[0] != comparison.variables[1]:
        lines.append(
            f"models differ: {comparison.variables[0]} vs "
            f"{comparison.variables[1]} variables (traces of two different models)"
        )
    for label, cut in zip("AB", comparison.truncated, strict=True):
        if cut:
            lines.append(
                f"note: trace {label} ends with a cut line (killed run); compared its whole steps."
            )
    divergence = comparison.divergence
    if divergence is not None:
        where = f"step {divergence.step}"
        if divergence.epoch is not None:
            where += f" (epoch {divergence.epoch})"
        lines.append(f"first diverging step: {where}")
        lines.append(f"  quantity: {divergence.quantity}")
        lines.append(f"  A: {divergence.expected}")
        lines.append(f"  B: {divergence.received}")
        if divergence.ulps is not None:
            lines.append(f"  distance: {divergence.ulps} ulps")
    elif comparison.empty:
        lines.append(
            "nothing compared: neither trace holds a step (header only: the run "
            "stopped before its first recorded step?)."
        )
    else:
        lines.append(f"bit-identical: all {comparison.steps_compared} steps.")
    return "\n".join(lines + _layer_lines(comparison))


def _layer_lines(comparison: _diff.TraceComparison) -> list[str]:
    """Where two `tfdet locate --record` traces part, layer by layer."""
    title = "layer records (tfdet locate --record)"
    if comparison.layer_location is not None:
        location = locate.location_lines(comparison.layer_location)
        return [f"{title}:", *(f"  {line}" for line in location)]
    if comparison.layers_compared:
        return [f"{title}: every layer bit-identical"]
    return []


def execute(args: argparse.Namespace) -> int:
    # TraceFormatError propagates: the CLI maps it to exit 2.
    with warnings.catch_warnings():
        # A cut trace is reported in the output below, once.
        warnings.simplefilter("ignore")
        a = _trace.read(args.a)
        b = _trace.read(args.b)
    comparison = _diff.compare(a, b)
    if args.plot:
        try:
            _plot.plot_comparison(a, b, args.plot)
        except (ImportError, ValueError, OSError) as error:
            raise app.UsageError(f"--plot: {error}") from error
    write_json(args.json, {"a": args.a, "b": args.b, **comparison.to_dict()})
    _output.out(format_comparison(comparison))
    if comparison.empty:
        return EXIT_USAGE
    return EXIT_OK if comparison.identical else EXIT_DIVERGED
