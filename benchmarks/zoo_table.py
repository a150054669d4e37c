"""The zoo table: what `tfdet.enable()` costs on every zoo model, one run.

Usage:
    python benchmarks/zoo_table.py [--models builtin:cnn,resnet50,...]
        [--blocks 4] [--steps 3] [--warmup 2] [--json FILE]
        [--without PATCHES] [--short]

For each model (`builtin:cnn` and `benchmarks/zoo.py`'s), one `tfdet cost`
measurement (`tfdet._cost._measure.measure`: a fresh process per setting,
the settings taking turns block by block, so that a shared machine's load
falls on each alike) of `tfdet cost`'s own CPU settings without XLA (plain
TensorFlow, `enable()`, `enable(threads=1)`, `enable(cpu_isa=None)`) and
the default before 2026-12-07, `enable(threads=1)` with TensorFlow's own
products and the compositions off ("old enable()"). Prints, per model and
setting, ms/step, the ratio to plain TensorFlow with the middle half of the
block ratios, the peak resident memory and its ratio, the tiers the setting
gives on that model (less those its uncovered ops take), and the advice
`tfdet cost` gives for every CPU tier among its own settings (the old
default is not one of them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfdet._cost import _advice, _measure, _timed_settings  # noqa: E402
from tfdet._pin import _cpus, _tiers  # noqa: E402

ZOO = REPO / "benchmarks" / "zoo.py"
MODELS = ("builtin:cnn", "resnet50", "mobilenet_v2", "encoder", "lstm_text")
# The default before the kernels and every core: one thread, TensorFlow's
# own products and convolutions under op determinism.
OLD_DEFAULT = _timed_settings.Setting(
    "old enable() (before 2026-12-07)",
    {
        "threads": 1,
        "patches": [
            "auto",
            "-pool_size_free_products",
            "-fixed_order_products",
            "-fixed_order_convolutions",
            "-portable_kernels",
            "-fixed_order_add_n",
        ],
    },
)


def target(model: str) -> str:
    return model if ":" in model else f"{ZOO}:{model}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write every report here")
    parser.add_argument(
        "--without",
        metavar="PATCHES",
        help="Also time enable() without these patches (comma-separated): "
        "the default before they joined it.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="Only plain TensorFlow, enable() and --without's setting.",
    )
    args = parser.parse_args()
    settings = _timed_settings.settings_for(_cpus.usable_cpus(), xla=False)
    # `tfdet cost`'s own settings: its advice is among these.
    own = {s.name for s in settings}
    if args.short:
        settings = [s for s in settings if s.name in ("plain TensorFlow", "enable()")]
    # Last: the advice prefers the earlier of two settings that tie.
    if args.without:
        names = args.without.split(",")
        settings.append(
            _timed_settings.Setting(
                f"enable() without {', '.join(names)}",
                {"patches": ["auto", *(f"-{name}" for name in names)]},
            )
        )
    if not args.short:
        settings.append(OLD_DEFAULT)
    reports = {}
    lines = [
        "| model | setting | ms/step | ratio [middle half] | peak MB (ratio) | "
        "same bits on |",
        "|---|---|---|---|---|---|",
    ]
    advice_lines = []
    for model in args.models.split(","):
        report = _measure.measure(
            target(model),
            settings,
            blocks=args.blocks,
            steps=args.steps,
            warmup=args.warmup,
            progress=lambda line, model=model: print(f"  {model}: {line}", flush=True),
            xla=False,
        )
        reports[model] = report.to_dict()
        plain_peak = report.plain.peak_mb
        for row in report.rows:
            peak = "-"
            if row.peak_mb is not None and plain_peak:
                peak = f"{row.peak_mb:.0f} ({row.peak_mb / plain_peak:.2f}x)"
            tiers = ", ".join(_tiers.TIERS[name].label for name in row.gives)
            lines.append(
                f"| {model} | {row.name} | {row.ms_per_step:.0f} | "
                f"{row.ratio:.2f}x [{row.ratio_q1:.2f}-{row.ratio_q3:.2f}] | "
                f"{peak} | {tiers or 'none'} |"
            )
        # `tfdet cost`'s own advice: among its settings, not the added ones.
        offered = [row for row in report.rows if row.name in own]
        for tier in _tiers.CPU_TIERS:
            advice = _advice.advise(offered, report.per_block, (tier.name,))
            advice_lines.append(
                f"{model}, {tier.label}: {advice.verdict} {advice.setting}"
                + (f" (rival {advice.rival})" if advice.rival else "")
            )
        print("\n".join(lines), flush=True)
    print("\n".join(["", *lines, "", "advice per tier:", *advice_lines]))
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
