"""Speed of the `portable_kernels` patch: the portable Erfc in one op.

Two measurements, each with TensorFlow's own op beside tfdet's two forms:

- the function: exact GELU (`tf.nn.gelu(approximate=False)`, forward and
  gradient) on the zoo encoder's feed-forward activations (32 x 128 x
  1024), ms per call in one process under `tfdet.enable()`, calling in turn
  TensorFlow's Erfc, the portable composition and the kernel, so a shared
  machine's load falls on all three alike (`--repeats` calls each, median);
- the model: `tfdet cost`'s interleaved blocks on `benchmarks/zoo.py:encoder`
  (or `--target`), plain TensorFlow, `enable()` and `enable(patches=["auto",
  "portable_kernels"])`, each in its own process; the last two must give
  the same digest.

    python benchmarks/portable_kernels.py [--repeats 20] [--blocks 4] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PATCHES = ["auto", "portable_kernels"]

_FUNCTION = """
import json, statistics, sys, time
import tfdet
tfdet.enable(patches={patches!r})
import numpy as np
import tensorflow as tf
from tfdet.patches import portable_erfc, portable_kernels

x = tf.constant(np.random.default_rng(0).standard_normal((32, 128, 1024)), tf.float32)
original = portable_erfc._ERFC.original
# (erfc, the kernel the portable Erfc uses while traced); the portable forms
# differentiate as the patch does (TensorFlow's Erfc gradient formula).
forms = {{
    "TensorFlow's Erfc": (lambda v: original(v), None),
    "portable composition": (portable_erfc.erfc, None),
    "portable kernel": (portable_erfc.erfc, portable_kernels.erfc),
}}

def gelu_step(erfc, kernel):
    @tf.function
    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = 0.5 * v * erfc(-v * 0.7071067811865476)
        return y, tape.gradient(y, v)
    portable_erfc.kernel = kernel
    step(x)  # Traced now, with this kernel.
    return step

steps = {{name: gelu_step(*form) for name, form in forms.items()}}
times = {{name: [] for name in steps}}
for _ in range({repeats}):
    for name, step in steps.items():
        start = time.perf_counter()
        step(x)[1].numpy()
        times[name].append(1000 * (time.perf_counter() - start))
print(json.dumps({{name: statistics.median(ms) for name, ms in times.items()}}))
"""


def function_times(repeats: int) -> dict[str, float]:
    """Median ms per GELU forward + gradient of each form, in one process."""
    done = subprocess.run(
        [sys.executable, "-c", _FUNCTION.format(patches=PATCHES, repeats=repeats)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_report(target: str, blocks: int, steps: int) -> dict:
    """`tfdet cost`'s figures for plain TensorFlow, enable() and the patch."""
    sys.path.insert(0, str(REPO))
    from tfdet._cost import _measure
    from tfdet._cost._timed_settings import PLAIN, Setting

    settings = [
        PLAIN,
        Setting("enable()", {}),
        Setting(f"enable(patches={json.dumps(PATCHES)})", {"patches": PATCHES}),
    ]
    report = _measure.measure(
        target, settings, blocks=blocks, steps=steps, progress=print
    )
    return report.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--target", default=f"{HERE / 'zoo.py'}:encoder")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="Also write the figures.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    functions = function_times(args.repeats)
    print("exact GELU, forward + gradient, 32x128x1024 float32 (median ms):")
    for name, ms in functions.items():
        print(f"  {name:<22}{ms:8.1f}")
    report = model_report(args.target, args.blocks, args.steps)
    print(f"{args.target}: ms/step, ratio to plain TensorFlow (middle half), digest")
    for row in report["rows"]:
        print(
            f"  {row['setting']['name']:<48}{row['ms_per_step']:9.1f}"
            f"{row['ratio']:7.2f} ({row['ratio_q1']:.2f}-{row['ratio_q3']:.2f})"
            f"  {(row['digests'] or ['-'])[0]}"
        )
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"function_ms": functions, "model": report}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
