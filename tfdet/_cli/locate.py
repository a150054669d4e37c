"""`tfdet locate`: the first layer whose bits differ between two processes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from absl import app

from tfdet import _builtins, _locate, _perturb
from tfdet._cli import write_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "locate",
        help="Find the first layer whose output or gradient bits differ between "
        "two processes.",
        description="Trains TARGET in two fresh processes perturbed as `tfdet "
        "check` does, fingerprinting at every step each layer's forward output, "
        "the loss, the gradient reaching each layer and each variable's "
        "gradient. Reports the first layer, in execution order, whose bits "
        "differ at the first diverging step, with the TensorFlow op types "
        "inside it. TARGET is package.module:function, path/to/file.py:function "
        "or builtin:NAME.",
        epilog="Built-in targets:\n"
        + _builtins.describe()
        + "\n\nPerturbations:\n"
        + "\n".join(f"{n}: {d}" for n, d in _perturb.DESCRIPTIONS.items())
        + "\n\nExit codes: 0 no layer differs, 1 a layer differs, 2 bad input, "
        "3 a run failed or timed out.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", default=None, help="Default: builtin:cnn.")
    parser.add_argument(
        "--steps",
        type=int,
        default=_locate.DEFAULT_STEPS,
        help=f"Training steps per run (default {_locate.DEFAULT_STEPS}).",
    )
    parser.add_argument(
        "--perturb",
        default="all",
        help=f"Comma-separated from {', '.join(_perturb.ALL)}; 'all' (default: those "
        "that apply on this machine) or 'none' (two identical processes).",
    )
    parser.add_argument(
        "--no-enable",
        dest="enable",
        action="store_false",
        help="Plain TensorFlow with only Keras seeds: what you get without tfdet.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="tfdet.enable(threads=N)."
    )
    parser.add_argument("--json", metavar="FILE", help="Write the full report as JSON.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per run.")
    parser.set_defaults(func=execute)


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


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
    try:
        options = _locate.LocateOptions(
            target=args.target,
            steps=args.steps,
            perturb=tuple(_perturb.parse(args.perturb)),
            enable=args.enable,
            seed=args.seed,
            threads=args.threads,
            timeout=args.timeout,
        )
        _locate.validate(options)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    report = _locate.locate(options, progress=_progress)
    print(format_report(report))
    write_json(args.json, report)
    return report["exit_code"]
