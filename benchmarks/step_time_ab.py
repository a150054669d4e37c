"""Step time under `tfdet.enable()`: this checkout against an earlier commit.

For a change to the kernels, whose bits or speed one commit changes: each
round trains every model once with the tfdet of commit `--before` (a git
worktree of it, its kernels built into the cache by its own sources) and
once with this checkout's, in fresh processes of this Python taken in turn,
the order swapped every round (the second of two processes tends to run a
little slower). Each process: `enable()`, the model (a zoo name or
`builtin:NAME`), 3 warm-up `train_on_batch` steps of 32 samples, then the
median of `--steps` timed ones, and its peak memory (`ru_maxrss`).

    python benchmarks/step_time_ab.py --before HEAD~1 \\
        [--models builtin:cnn,mobilenet_v2,resnet50] [--rounds 3] [--steps 8]

Prints each process's figures, then per model the medians and the median of
the rounds' after/before ratios.

`--calls` times the kernels alone instead, with less noise than a step
(for a change to the split, whose tasks a step's other ops hide): each
process computes every product call of a model that
`benchmarks/kernel_parallelism.json` records (batch, m, n, k), as a float32
product of those sizes by `fixed_order.matmul` or `batch_matmul` (a
convolution's call as the product over its patches, packed plainly), the
fastest of `--steps` calls each, and prints the sum over the calls, each
counted as often as a step makes it.

`--convolutions LAYERS` times convolutions alone: each process runs
`benchmarks/fixed_order_convolutions.py --layers LAYERS --fastest` with one
side's tfdet, and the table gives each layer's forward, input gradient and
filter gradient as before / after / TensorFlow's op, the fastest call of
every round (TensorFlow's over both sides' processes), with their sums.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[3])
import tfdet
tfdet.enable(seed=0)
import zoo
model, x, y = zoo.load(sys.argv[1])
steps = int(sys.argv[2])
x, y = x[:32], y[:32]
for _ in range(3):
    model.train_on_batch(x, y)
times = []
for _ in range(steps):
    start = time.perf_counter()
    model.train_on_batch(x, y)
    times.append(time.perf_counter() - start)
print(json.dumps({"ms": 1000 * statistics.median(times),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""

CALLS = """
import json, resource, sys, time
import numpy as np
import tensorflow as tf
from tfdet._kernels import fixed_order
rows = [r for r in json.load(open(sys.argv[3])) if r["model"] == sys.argv[1]
        and not r["op"].startswith("Depthwise")]
rng = np.random.default_rng(0)
total = 0.0
for row in rows:
    batch, m, n, k = row["shape"]
    a = tf.constant(rng.normal(size=(batch, m, k) if batch > 1 else (m, k)), tf.float32)
    b = tf.constant(rng.normal(size=(batch, k, n) if batch > 1 else (k, n)), tf.float32)
    product = fixed_order.batch_matmul if batch > 1 else fixed_order.matmul
    product(a, b)
    fastest = float("inf")
    for _ in range(int(sys.argv[2])):
        start = time.perf_counter()
        product(a, b).numpy()
        fastest = min(fastest, time.perf_counter() - start)
    total += row["count"] * fastest
print(json.dumps({"ms": 1000 * total,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def step_time(
    source: Path, model: str, steps: int, calls: bool = False
) -> dict[str, float]:
    """One process's median step (ms) and peak memory (MB), with the tfdet
    of `source`."""
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONHASHSEED": "0"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    child, data = (
        (CALLS, REPO / "benchmarks" / "kernel_parallelism.json")
        if calls
        else (CHILD, REPO / "benchmarks")
    )
    done = subprocess.run(
        [sys.executable, "-c", child, model, str(steps), str(data)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{model} did not train:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def convolution_times(
    source: Path, layers: str, repeats: int
) -> dict[tuple[str, int], tuple[float, float]]:
    """One process's fastest (kernel, TensorFlow) ms per (layer, op: 0
    forward, 1 input gradient, 2 filter gradient), with the tfdet of
    `source`."""
    env = {**os.environ, "PYTHONPATH": str(source), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fixed_order_convolutions.py"),
         "--layers", layers, "--repeats", str(repeats), "--batch", "32",
         "--fastest"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{layers} did not run:\n{done.stderr[-3000:]}")
    times = {}
    for line in done.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or "/" not in cells[1] or cells[0] == "layer":
            continue
        for op, cell in enumerate(cells[1:]):
            kernel, tensorflow = (float(value) for value in cell.split("/"))
            times[(cells[0], op)] = (kernel, tensorflow)
    return times


def print_convolutions(found: dict[str, list[dict]]) -> None:
    """The layers' table: fastest before / after / TensorFlow per op."""
    cells = found["after"][0].keys()
    fastest = {
        key: (
            min(times[key][0] for times in found["before"]),
            min(times[key][0] for times in found["after"]),
            min(times[key][1] for side in found.values() for times in side),
        )
        for key in cells
    }
    print("| layer | forward before / after / TF | input gradient | filter gradient |")
    print("|---|---|---|---|")
    for layer in dict.fromkeys(name for name, _ in cells):
        row = (fastest[(layer, op)] for op in range(3))
        print(
            f"| {layer} | "
            + " | ".join(" / ".join(f"{t:.2f}" for t in r) for r in row)
            + " |"
        )
    sums = [
        [
            sum(fastest[(layer, op)][i] for layer, o in cells if o == op)
            for i in range(3)
        ]
        for op in range(3)
    ]
    print(
        "| sum | " + " | ".join(" / ".join(f"{t:.2f}" for t in s) for s in sums) + " |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="The commit to compare.")
    parser.add_argument("--models", default="builtin:cnn,mobilenet_v2,resnet50")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--calls",
        action="store_true",
        help="Time each model's recorded kernel calls, not its step.",
    )
    parser.add_argument(
        "--convolutions",
        metavar="LAYERS",
        help="Time fixed_order_convolutions.py's LAYERS (cnn, resnet50, "
        "first, pointwise) instead of models.",
    )
    args = parser.parse_args(argv)
    models = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="tfdet-before-") as scratch:
        before = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
             str(before), args.before],
            check=True,
        )  # fmt: skip
        try:
            found: dict[tuple[str, str], list[dict[str, float]]] = {}
            layers: dict[str, list[dict]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                sides = [("before", before), ("after", REPO)]
                if args.convolutions:
                    for side, source in sides[:: 1 if round_ % 2 == 0 else -1]:
                        layers[side].append(
                            convolution_times(source, args.convolutions, args.steps)
                        )
                    continue
                for model in models:
                    for side, source in sides[:: 1 if round_ % 2 == 0 else -1]:
                        result = step_time(source, model, args.steps, args.calls)
                        found.setdefault((model, side), []).append(result)
                        print(
                            f"round {round_ + 1} {model} {side}: "
                            f"{result['ms']:.1f} ms, {result['peak_mb']} MB",
                            flush=True,
                        )
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force",
                 str(before)],
                check=False,
            )  # fmt: skip
    if args.convolutions:
        print_convolutions(layers)
        return 0
    for model in models:
        after, old = found[(model, "after")], found[(model, "before")]
        ratios = [a["ms"] / b["ms"] for a, b in zip(after, old, strict=True)]
        print(
            f"{model}: after {statistics.median(r['ms'] for r in after):.1f} ms, "
            f"before {statistics.median(r['ms'] for r in old):.1f} ms, "
            f"ratio {statistics.median(ratios):.3f}; peak "
            f"{max(r['peak_mb'] for r in after)} against "
            f"{max(r['peak_mb'] for r in old)} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
