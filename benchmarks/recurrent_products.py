"""Speed of tfdet's fixed-order product at a recurrent layer's step shapes.

A recurrent layer multiplies small matrices once per time step, one after
another: its forward product and the two gradient products (dA = dC @ B^T,
dB = A^T @ dC) of the zoo's LSTM (64 sequences, 128 units, 4 gates) and GRU
(3 gates; also at 32 sequences). Eager calls cost more than such a product,
so each is timed inside one `tf.function`: a `tf.while_loop` of `--steps`
sequential iterations (`parallel_iterations=1`, one inter-op thread, as
tfdet pins it), each scaling A by the step (so no call repeats another)
and adding the product into a sum. The same loop without the product is
timed too and subtracted: us per product of

- `tf.matmul` (TensorFlow's own kernel: oneDNN's on x86),
- tfdet's kernel,

called alternately, median of `--repeats`, at the intra-op pool's default
size (all cores). The kernel is built (or found in the cache) first.

    python benchmarks/recurrent_products.py [--steps 100] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

# name: (m, k, n, transpose_a, transpose_b)
SHAPES = {
    "LSTM forward": (64, 128, 512, False, False),
    "LSTM dA = dC @ B^T": (64, 512, 128, False, True),
    "LSTM dB = A^T @ dC": (128, 64, 512, True, False),
    "GRU forward": (64, 128, 384, False, False),
    "GRU dA = dC @ B^T": (64, 384, 128, False, True),
    "GRU dB = A^T @ dC": (128, 64, 384, True, False),
    "GRU forward, 32 sequences": (32, 128, 384, False, False),
}


def _microseconds(tf, kernels, shape, steps: int, repeats: int, rng) -> tuple:
    """(tf.matmul's, the kernel's) us per product of one shape."""
    m, k, n, t_a, t_b = shape
    a = tf.constant(rng.normal(size=(k, m) if t_a else (m, k)), tf.float32)
    b = tf.constant(rng.normal(size=(n, k) if t_b else (k, n)), tf.float32)

    def loop(product):
        @tf.function(autograph=False)
        def run(a, b):
            def body(step, total):
                scaled = a * (1.0 + tf.cast(step, tf.float32) * 1e-6)
                return step + 1, total + product(scaled, b)

            return tf.while_loop(
                lambda step, total: step < steps,
                body,
                (tf.constant(0), tf.zeros((m, n))),
                parallel_iterations=1,
            )[1]

        return run

    calls = {
        "empty": loop(lambda a, b: tf.zeros((m, n)) + a[0, 0]),
        "tf.matmul": loop(
            lambda a, b: tf.matmul(a, b, transpose_a=t_a, transpose_b=t_b)
        ),
        "kernel": loop(
            lambda a, b: kernels.matmul(a, b, transpose_a=t_a, transpose_b=t_b)
        ),
    }
    times = {label: [] for label in calls}
    for call in calls.values():
        call(a, b).numpy()
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            call(a, b).numpy()
            times[label].append((time.perf_counter() - start) * 1e6 / steps)
    empty = statistics.median(times["empty"])
    return (
        statistics.median(times["tf.matmul"]) - empty,
        statistics.median(times["kernel"]) - empty,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    from tfdet._kernels import fixed_order as kernels

    assert kernels.load() is not None, "the kernel did not build"
    rng = np.random.default_rng(0)
    print("| product | shape | tf.matmul, us | kernel, us | kernel / tf.matmul |")
    print("|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        tf_us, kernel_us = _microseconds(
            tf, kernels, shape, args.steps, args.repeats, rng
        )
        m, k, n = shape[:3]
        print(
            f"| {name} | {m}x{k} @ {k}x{n} | {tf_us:.1f} | {kernel_us:.1f} | "
            f"{kernel_us / tf_us:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
