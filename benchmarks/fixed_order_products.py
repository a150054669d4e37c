"""Speed of tfdet's fixed-order product kernel against tf.matmul.

For transformer and CNN-head shapes, the forward product and its two
gradient products (dA = dC @ B^T, dB = A^T @ dC, as the transpose flags
read them), ms per call of:

- `tf.matmul` with TensorFlow's defaults (all cores, whatever library and
  ISA TensorFlow picks on this CPU; no tfdet),
- the kernel at all cores (TensorFlow's default intra-op pool), called
  alternately with `tf.matmul` in the same process,
- the kernel at 1 thread (a second process: the pool size is fixed at a
  process's start).

`--repeats` timed calls after two warm-up calls; min / median / max ms per
cell, ratios of medians to `tf.matmul`'s at all cores. The kernel is built
(or found in the cache) first.

    python benchmarks/fixed_order_products.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time

# name: (batch or None, m, k, n)
SHAPES = {
    "4096x256 @ 256x768": (None, 4096, 256, 768),
    "4096x512 @ 512x512": (None, 4096, 512, 512),
    "64x2048 @ 2048x1000": (None, 64, 2048, 1000),
    "64 x (64x64 @ 64x64)": (64, 64, 64, 64),
}
# product: (transpose_a, transpose_b, shapes of its two operands from m, k, n)
PRODUCTS = {
    "forward": (False, False, lambda m, k, n: ((m, k), (k, n))),
    "dA = dC @ B^T": (False, True, lambda m, k, n: ((m, n), (k, n))),
    "dB = A^T @ dC": (True, False, lambda m, k, n: ((m, k), (m, n))),
}


def _child(setting: str, repeats: int) -> None:
    """Times every cell of one pool setting; prints {cell: {op: [ms, ...]}}.

    `tf.matmul` and the kernel are called alternately, so the load of a
    shared machine falls on both alike.
    """
    import numpy as np
    import tensorflow as tf

    if setting == "1_thread":
        tf.config.threading.set_intra_op_parallelism_threads(1)
    from tfdet._kernels import fixed_order as kernels

    assert kernels.load() is not None, "the kernel did not build"
    rng = np.random.default_rng(0)
    times = {}
    for shape, (batch, m, k, n) in SHAPES.items():
        for product, (t_a, t_b, operands) in PRODUCTS.items():
            a_shape, b_shape = operands(m, k, n)
            lead = () if batch is None else (batch,)
            a = tf.constant(rng.normal(size=lead + a_shape), tf.float32)
            b = tf.constant(rng.normal(size=lead + b_shape), tf.float32)
            if batch is None:
                kernel = functools.partial(
                    kernels.matmul, a, b, transpose_a=t_a, transpose_b=t_b
                )
            else:
                kernel = functools.partial(
                    kernels.batch_matmul, a, b, adj_x=t_a, adj_y=t_b
                )
            calls = {
                "tf_matmul": functools.partial(
                    tf.matmul, a, b, transpose_a=t_a, transpose_b=t_b
                ),
                "kernel": kernel,
            }
            found = {name: [] for name in calls}
            for _ in range(2):
                for call in calls.values():
                    call().numpy()
            for _ in range(repeats):
                for name, call in calls.items():
                    start = time.perf_counter()
                    call().numpy()
                    found[name].append((time.perf_counter() - start) * 1e3)
            times[f"{shape} | {product}"] = found
    print(json.dumps(times))


SETTINGS = ("all_cores", "1_thread")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.repeats)
        return
    results = {}
    for setting in SETTINGS:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                setting,
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        "| shape | product | tf.matmul, all cores | kernel, all cores | "
        "kernel, 1 thread | kernel / tf.matmul, all cores | kernel 1 thread / "
        "tf.matmul all cores |"
    )
    print("|---|---|---|---|---|---|---|")
    for cell, found in results["all_cores"].items():
        cells = [
            found["tf_matmul"],
            found["kernel"],
            results["1_thread"][cell]["kernel"],
        ]
        medians = [statistics.median(ms) for ms in cells]
        row = cell.split(" | ")
        row += [
            f"{min(ms):.2f} / {statistics.median(ms):.2f} / {max(ms):.2f}"
            for ms in cells
        ]
        row += [f"{medians[1] / medians[0]:.2f}x", f"{medians[2] / medians[0]:.2f}x"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
