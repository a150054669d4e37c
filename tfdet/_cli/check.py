"""`tfdet check`: the two-process bit-equality smoke test."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from absl import app

from tfdet import _builtins, _check, _perturb
from tfdet._cli import write_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="Train in fresh processes that look like different machines; "
        "compare every bit.",
        description="Trains TARGET with train_on_batch in N fresh processes, "
        "started together, each perturbed to look like another machine, and "
        "compares every step's loss and metric bits and every weight bit. "
        "TARGET is package.module:function, path/to/file.py:function or "
        "builtin:NAME; the function returns a compiled Keras model or "
        "(model, x, y). Without data, seeded batches are synthesized.",
        epilog="Built-in targets:\n"
        + _builtins.describe()
        + "\n\nPerturbations:\n"
        + "\n".join(f"{n}: {d}" for n, d in _perturb.DESCRIPTIONS.items())
        + "\n\nExit codes: 0 bit-identical, 1 diverged, 2 bad input, 3 a run "
        "failed or timed out, 4 device not available.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", default=None, help="Default: builtin:cnn.")
    parser.add_argument(
        "--runs", type=int, default=_check.DEFAULT_RUNS, help="Processes (default 2)."
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=_check.DEFAULT_STEPS,
        help="train_on_batch steps per run.",
    )
    parser.add_argument("--device", default="all", choices=("cpu", "gpu", "all"))
    parser.add_argument(
        "--perturb",
        default="all",
        help=f"Comma-separated from {', '.join(_perturb.ALL)}; 'all' (default: those "
        "that apply on this machine) or 'none'.",
    )
    parser.add_argument(
        "--no-enable",
        dest="enable",
        action="store_false",
        help="Plain TensorFlow with only Keras seeds: what you get without tfdet.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="tfdet.enable(threads=N) (default 1); not with --no-enable.",
    )
    parser.add_argument("--json", metavar="FILE", help="Write the full report as JSON.")
    parser.add_argument(
        "--timeout", type=float, default=_check.DEFAULT_TIMEOUT, help="Seconds per run."
    )
    parser.add_argument(
        "--no-attribute",
        dest="attribute",
        action="store_false",
        help="On divergence, skip the re-runs that find the perturbation responsible.",
    )
    parser.set_defaults(func=execute)


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def format_report(report: dict[str, Any]) -> str:
    """The short human report: per device, runs, perturbations, verdict."""
    mode = "with tfdet.enable()" if report["enable"] else "without tfdet (--no-enable)"
    lines = [
        f"tfdet check {report['target']} {mode}: {report['runs']} runs x "
        f"{report['steps']} steps"
    ]
    for device, result in report["devices"].items():
        if result.get("status") == "skipped":
            lines.append(f"{device.upper()}: skipped, {result['reason']}")
            continue
        lines.append(f"{device.upper()}: {result['verdict'].upper()}")
        for run in result["runs"]:
            labels = "; ".join(run["perturbations"].values()) or "no perturbation"
            state = (
                "ok"
                if run["ok"]
                else ("timed out" if run["timed_out"] else f"exit {run['returncode']}")
            )
            lines.append(
                f"  run {run['index']} ({state}, {run['seconds']:.1f}s): {labels}"
            )
        for name, reason in result.get("perturbations_skipped", {}).items():
            lines.append(f"  perturbation {name} not applied: {reason}")
        if result["verdict"] == "failed":
            for run in result["runs"]:
                if not run["ok"]:
                    lines.append(f"  run {run['index']} failed; stderr tail:")
                    lines.extend(
                        f"    {line}"
                        for line in run.get("stderr_tail", "").splitlines()
                    )
        divergence = result.get("divergence")
        if divergence:
            a, b = divergence["runs"]
            for name, (left, right) in divergence.get(
                "profile_differences", {}
            ).items():
                lines.append(
                    f"  profile differs (run {a} vs run {b}): {name}: {left} vs {right}"
                )
            lines.append(
                f"  first divergence (run {a} vs run {b}): {divergence['description']}"
            )
            attribution = divergence.get("attribution")
            if attribution:
                lines.append(f"  cause: {attribution['verdict']}")
                for name, outcome in attribution["alone"].items():
                    lines.append(f"    {name} alone: {outcome}")
        elif result["verdict"] == "identical":
            lines.append(
                f"  every loss, metric and weight bit identical across {len(result['runs'])} runs"
            )
    lines.append(f"verdict: {report['verdict']} (exit {report['exit_code']})")
    return "\n".join(lines)


def _threads(args: argparse.Namespace) -> int:
    if args.threads is not None and not args.enable:
        raise ValueError(
            "Expected --threads only with tfdet enabled: --no-enable runs plain "
            "TensorFlow, whose thread pools follow the cores. Drop one of them."
        )
    return 1 if args.threads is None else args.threads


def execute(args: argparse.Namespace) -> int:
    try:
        perturb = tuple(_perturb.parse(args.perturb))
        options = _check.CheckOptions(
            target=args.target,
            runs=args.runs,
            steps=args.steps,
            device=args.device,
            perturb=perturb,
            enable=args.enable,
            seed=args.seed,
            threads=_threads(args),
            timeout=args.timeout,
            attribute=args.attribute,
        )
        _check._validate(options)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    report = _check.check(options, progress=_progress)
    print(format_report(report))
    write_json(args.json, report)
    return report["exit_code"]
