"""Speed and accuracy of the portable math library, beside TensorFlow's ops.

For each function (exp, log, log1p, expm1, tanh, sigmoid, sin, cos, pow with
a number) on the zoo encoder's feed-forward activations (32 x 128 x 1024
float32), and for the sums a model makes (softmax's rows of 128, a layer
normalization's rows of 256, batch normalization's columns of 64 over 32 x
56 x 56, a loss's mean over 4,096): milliseconds per call of tfdet's op and
of TensorFlow's (`tf.raw_ops`), called in turn in one process so that a
shared machine's load falls on both alike (median of `--repeats`), and the
largest error in ulps against float64 (numpy) of each, and between the two.

    python benchmarks/portable_math.py [--repeats 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The sums: name -> (the [outer, n, inner] view, mean).
SUMS = {
    "softmax rows (128)": ((32 * 8 * 128, 128, 1), False),
    "layer norm rows (256)": ((32 * 128, 256, 1), True),
    "batch norm columns (64)": ((1, 32 * 56 * 56, 64), True),
    "loss mean (4096)": ((1, 4096, 1), True),
}


def _ulps(found: Any, reference: Any) -> float:
    """The largest distance in float32 ulps (at the reference's magnitude)
    between `found` and the float64 `reference`, over finite references."""
    import numpy as np

    finite = np.isfinite(reference) & (np.abs(reference) < 3e38)
    ref32 = reference[finite].astype(np.float32)
    spacing = np.spacing(np.abs(ref32)).astype(np.float64)
    spacing[spacing == 0] = np.spacing(np.float32(0))
    return float(np.max(np.abs(found[finite] - reference[finite]) / spacing))


def _row(ours: Any, theirs: Any, reference: Any, repeats: int) -> dict[str, float]:
    """One op's times (called in turn, so that load falls on both), errors
    against the float64 reference, and elements whose bits differ."""
    import numpy as np

    found, own = np.asarray(ours()), np.asarray(theirs())
    times: dict[str, list[float]] = {"tfdet": [], "tensorflow": []}
    for _ in range(repeats):
        for name, call in (("tfdet", ours), ("tensorflow", theirs)):
            start = time.perf_counter()
            call()
            times[name].append(1000 * (time.perf_counter() - start))
    return {
        "tfdet_ms": round(statistics.median(times["tfdet"]), 3),
        "tensorflow_ms": round(statistics.median(times["tensorflow"]), 3),
        "tfdet_ulps": round(_ulps(found, reference), 2),
        "tensorflow_ulps": round(_ulps(own, reference), 2),
        "elements_differing_from_tensorflow": int(
            np.sum(found.view(np.uint32) != own.view(np.uint32))
        ),
    }


def measure(repeats: int) -> dict[str, dict[str, float]]:
    import numpy as np
    import tensorflow as tf

    from tfdet._kernels import portable_math

    library = portable_math.LIBRARY.load()
    if library is None:
        raise SystemExit("the portable math library cannot be built here")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((32, 128, 1024)) * 3).astype(np.float32)
    positive = np.abs(x) + np.float32(1e-3)
    exponent = np.float32(2.5)
    # name -> (input, tfdet's call, TensorFlow's op, the float64 function).
    functions = {
        "exp": (x, tf.raw_ops.Exp, np.exp),
        "log": (positive, tf.raw_ops.Log, np.log),
        "log1p": (positive, tf.raw_ops.Log1p, np.log1p),
        "expm1": (x, tf.raw_ops.Expm1, np.expm1),
        "tanh": (x, tf.raw_ops.Tanh, np.tanh),
        "sigmoid": (x, tf.raw_ops.Sigmoid, lambda v: 1 / (1 + np.exp(-v))),
        "sin": (x, tf.raw_ops.Sin, np.sin),
        "cos": (x, tf.raw_ops.Cos, np.cos),
    }
    rows: dict[str, dict[str, float]] = {}
    for function, (value, op, exact) in functions.items():
        tensor = tf.constant(value)
        rows[function] = _row(
            functools.partial(library.tfdet_portable_unary, tensor, function=function),
            functools.partial(op, x=tensor),
            exact(value.astype(np.float64)),
            repeats,
        )
    tensor = tf.constant(positive)
    rows["pow (2.5)"] = _row(
        functools.partial(library.tfdet_portable_pow, tensor, exponent),
        functools.partial(tf.raw_ops.Pow, x=tensor, y=exponent),
        positive.astype(np.float64) ** 2.5,
        repeats,
    )
    for name, (shape, mean) in SUMS.items():
        tensor = tf.constant(rng.standard_normal(shape).astype(np.float32))
        op = tf.raw_ops.Mean if mean else tf.raw_ops.Sum
        rows[name] = _row(
            functools.partial(library.tfdet_fixed_order_sum, tensor, 1, mean=mean),
            functools.partial(op, input=tensor, axis=1),
            np.asarray(tensor, np.float64).sum(1) / (shape[1] if mean else 1),
            repeats,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", metavar="FILE", help="Also write the rows as JSON.")
    args = parser.parse_args()
    rows = measure(args.repeats)
    print(
        "| op | tfdet ms | TensorFlow ms | ratio | tfdet ulps | TensorFlow ulps | differ |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        ratio = row["tfdet_ms"] / max(row["tensorflow_ms"], 1e-9)
        print(
            f"| {name} | {row['tfdet_ms']} | {row['tensorflow_ms']} | {ratio:.2f}x "
            f"| {row['tfdet_ulps']} | {row['tensorflow_ulps']} "
            f"| {row['elements_differing_from_tensorflow']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
