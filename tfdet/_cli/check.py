"""`tfdet check`: the two-process bit-equality smoke test."""

from __future__ import annotations

import argparse
from typing import Any

from absl import app

from tfdet._cli import _output, _training_flags, write_json
from tfdet._runs import _check, _perturb


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="Train in fresh processes that look like different machines; "
        "compare every bit.",
        description="Trains TARGET with train_on_batch in N fresh processes, "
        "started together, each perturbed to look like another machine, and "
        "compares every step's loss and metric bits and every weight bit. "
        + _training_flags.TARGET_HELP,
        epilog=_training_flags.epilog(
            "0 bit-identical, 1 diverged, 2 bad input, 3 a run failed or timed "
            "out, 4 device not available."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _training_flags.add(
        parser,
        default_steps=_check.DEFAULT_STEPS,
        default_timeout=_check.DEFAULT_TIMEOUT,
    )
    parser.add_argument(
        "--runs", type=int, default=_check.DEFAULT_RUNS, help="Processes (default 2)."
    )
    parser.add_argument("--device", default="all", choices=("cpu", "gpu", "all"))
    parser.add_argument(
        "--no-attribute",
        dest="attribute",
        action="store_false",
        help="On divergence, skip the re-runs that find the perturbation responsible.",
    )
    parser.set_defaults(func=execute)


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
            threads=_training_flags.threads(args),
            timeout=args.timeout,
            attribute=args.attribute,
        )
        _check._validate(options)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    report = _check.check(options, progress=_training_flags.progress)
    _output.out(format_report(report))
    write_json(args.json, report)
    return report["exit_code"]
