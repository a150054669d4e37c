"""Print the environment fingerprint (versions, CPU, GPUs, variables).

Prints what can explain a difference in bits between two machines: versions,
TensorFlow build, CPU model and ISA flags, cores and affinity, GPUs,
determinism-relevant environment variables, and where tfdet's kernels come
from (shipped with the wheel, built at install, cached, or nowhere).

Exit codes: 0 printed, 2 the --json file cannot be written.
"""

from __future__ import annotations

import argparse

from tfdet._cli import _output, write_json
from tfdet._kernels import fixed_order, portable
from tfdet._pin import _environment
from tfdet._setup import _enable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="Also write the report as JSON.")


def format_fingerprint(facts: dict) -> str:
    """Human-readable lines for a fingerprint dict."""
    lines = []
    for key, value in facts.items():
        if key == "env":
            lines.append("env:")
            lines.extend(
                f"  {name}={'(unset)' if val is None else val}"
                for name, val in value.items()
            )
        elif key == "kernels":
            lines.append("kernels:")
            lines.extend(f"  {name}: {where}" for name, where in value.items())
        elif key == "profile":
            lines.append(
                "profile: (tfdet not enabled)" if value is None else "profile:"
            )
            if value:
                lines.extend(f"  {name}: {val}" for name, val in value.items())
        elif isinstance(value, list):
            lines.append(f"{key}: {' '.join(map(str, value)) or '(none)'}")
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def execute(args: argparse.Namespace) -> int:
    facts = _environment.fingerprint(_enable.profile())
    facts["kernels"] = {
        library.name: library.where()
        for library in (fixed_order.LIBRARY, portable.LIBRARY)
    }
    _output.out(format_fingerprint(facts))
    write_json(args.json, facts)
    return 0
