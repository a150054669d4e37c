"""The fixed-order kernel's bits on this architecture, against the record.

One process (one thread for TensorFlow's ops): a 32x512 @ 512x64 product and a strided 3x3
convolution of 16 channels (4x12x12x16 images, 24 filters), each with both
gradients, and two long sums that the kernel cuts into K blocks (a product's
weight gradient over 9,000 rows, a filter gradient over 8,192 positions),
computed by tfdet's fixed-order kernel and by TensorFlow's own
ops (`tf.matmul`, `Conv2D`: the control) from one seeded input set;
a sha256 digest (16 hex digits) of each group. The kernel's chains are
fixed by the shapes alone, so its digests are the same on every
architecture and vector unit (x86-64 AVX2, its scalar path, aarch64);
TensorFlow's follow the architecture's kernels.

    python benchmarks/fixed_order_digests.py            # print, compare
    python benchmarks/fixed_order_digests.py --record   # and keep them

On an emulated aarch64 Python (an x86-64 host), build the kernel with a
cross compiler: `CXX=aarch64-linux-gnu-g++`. The record is
`benchmarks/fixed_order_digests.json`, one entry per architecture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECORD = Path(__file__).with_name("fixed_order_digests.json")


def _digest(tensors: list[Any]) -> str:
    import numpy as np

    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(np.ascontiguousarray(np.asarray(tensor)).tobytes())
    return sha.hexdigest()[:16]


def digests() -> dict[str, dict[str, str]]:
    """{"kernel" | "tensorflow": {"matmul", "conv2d", "long_sums": digest}}.

    Raises:
        RuntimeError: the kernel cannot be built here.
    """
    import numpy as np
    import tensorflow as tf

    from tfdet._kernels import fixed_order as kernels

    if kernels.load() is None:
        raise RuntimeError("the fixed-order kernel cannot be built here")
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(32, 512)), tf.float32)
    b = tf.constant(rng.normal(size=(512, 64)), tf.float32)
    product_gradient = tf.constant(rng.normal(size=(32, 64)), tf.float32)
    x = tf.constant(rng.normal(size=(4, 12, 12, 16)), tf.float32)
    w = tf.constant(rng.normal(size=(3, 3, 16, 24)), tf.float32)
    attributes = {"strides": [1, 2, 2, 1], "padding": "SAME"}
    image_gradient = tf.constant(rng.normal(size=(4, 6, 6, 24)), tf.float32)
    # Long sums, cut into K blocks: a product's weight gradient over 9,000
    # rows, and a filter gradient over 8 x 32 x 32 positions.
    rows = tf.constant(rng.normal(size=(9000, 40)), tf.float32)
    rows_gradient = tf.constant(rng.normal(size=(9000, 24)), tf.float32)
    images = tf.constant(rng.normal(size=(8, 34, 34, 3)), tf.float32)
    small_w = tf.constant(rng.normal(size=(3, 3, 3, 8)), tf.float32)
    positions_gradient = tf.constant(rng.normal(size=(8, 32, 32, 8)), tf.float32)
    found = {}
    for name, product, convolution in (
        ("kernel", kernels.matmul, kernels.conv2d),
        (
            "tensorflow",
            tf.matmul,
            lambda x, w, **a: tf.raw_ops.Conv2D(input=x, filter=w, **a),
        ),
    ):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([a, b, x, w])
            c = product(a, b)
            y = convolution(x, w, **attributes)
        with tf.GradientTape() as tape_long:
            tape_long.watch(small_w)
            long_y = convolution(images, small_w, strides=[1, 1, 1, 1], padding="VALID")
        found[name] = {
            "matmul": _digest(
                [c, *tape.gradient(c, [a, b], output_gradients=product_gradient)]
            ),
            "conv2d": _digest(
                [y, *tape.gradient(y, [x, w], output_gradients=image_gradient)]
            ),
            "long_sums": _digest(
                [
                    product(rows, rows_gradient, transpose_a=True),
                    tape_long.gradient(
                        long_y, small_w, output_gradients=positions_gradient
                    ),
                ]
            ),
        }
    return found


def recorded(record: Path = RECORD) -> dict[str, Any]:
    """The record: {architecture: {"machine", "tensorflow", "digests"}}."""
    return json.loads(record.read_text())


def run(
    description: str, record_path: Path, compute: Any, what: str = "kernel"
) -> None:
    """The command line of a digest record: print this architecture's
    `compute()`, compare its "kernel" digests with each recorded
    architecture's, and with `--record` keep them as this one's entry."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--record", action="store_true", help="Keep this entry.")
    parser.add_argument(
        "--machine", default="", help="What the entry says this machine is."
    )
    args = parser.parse_args()
    import tensorflow as tf

    # TensorFlow's own digests, the control, at one thread (tfdet's do not
    # follow the pool size).
    tf.config.threading.set_intra_op_parallelism_threads(1)
    found = compute()
    architecture = platform.machine()
    record = recorded(record_path) if record_path.exists() else {}
    print(json.dumps({architecture: found}, indent=2))
    for other, entry in record.items():
        same = entry["digests"]["kernel"] == found["kernel"]
        print(f"{what} digests {'equal' if same else 'DIFFER from'} {other}'s")
    if args.record:
        record[architecture] = {
            "machine": args.machine,
            "tensorflow": tf.__version__,
            "digests": found,
        }
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    run(__doc__.splitlines()[0], RECORD, digests)
