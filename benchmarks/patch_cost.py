"""What each tfdet patch costs on CPU: the patched op against the original.

Usage:
    python benchmarks/patch_cost.py [--rounds 15] [--iterations 10] [--threads 1]
        [--patch NAME ...] [--json FILE]

For every registered patch that has a case here (a patch without one is
listed as such, so a new patch shows up), one `tf.function` runs the entry point that reaches the
refused op (forward and backward where the original op has a gradient) with
TensorFlow's op and again with the patch installed, in the same process under
op determinism. The two take turns: each round times `--iterations` calls of
the original, then of the patched version, so the load of a shared machine
hits both alike; the table reports the median per-call time of each over the
rounds and the median of the per-round ratios (patched / original).

This measures the CPU only (no GPU here). On GPU the original ops raise or
run on the host under determinism, so there the comparison is against an
error or a device-to-host round trip, not against these CPU times.

The opt-in `pool_size_free_products` replaces ops that are not refused but
whose bits follow the pool size: its point is a pool of every core, so time
it at `--threads 1` and at `--threads` = the cores (`--patch
pool_size_free_products`); both sides run oneDNN, as under tfdet's profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@dataclasses.dataclass
class Case:
    """One patched entry point and the inputs it is timed on."""

    patch: str
    description: str
    make: Callable[[], Callable[[], Any]]  # Returns a no-argument step to time.
    # The patch acts when the step runs, not when it is traced (a process
    # setting): it is installed around each timing of the patched step.
    at_run_time: bool = False
    # Op determinism refuses the original: it is compiled without it (what a
    # user gets who turns determinism off), then determinism is back on.
    original_refused: bool = False


def _cases() -> list[Case]:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def resize_step() -> Callable[[], Any]:
        x = tf.constant(rng.standard_normal((16, 32, 32, 16)), tf.float32)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.image.resize(x, (64, 64), method="nearest")
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, x)

        return step

    def bincount_step() -> Callable[[], Any]:
        tokens = tf.constant(rng.integers(0, 1000, (256, 64)), tf.int32)

        @tf.function
        def step() -> Any:
            return tf.math.bincount(tokens, minlength=1000, maxlength=1000, axis=-1)

        return step

    def confusion_step() -> Callable[[], Any]:
        labels = tf.constant(rng.integers(0, 21, 65536), tf.int64)
        predictions = tf.constant(rng.integers(0, 21, 65536), tf.int64)

        @tf.function
        def step() -> Any:
            return tf.math.confusion_matrix(
                labels, predictions, num_classes=21, dtype=tf.float32
            )

        return step

    def contrast_step() -> Callable[[], Any]:
        images = tf.constant(rng.random((32, 64, 64, 3)), tf.float32)

        @tf.function
        def step() -> Any:
            return tf.image.adjust_contrast(images, 1.3)

        return step

    def batch_norm_step() -> Callable[[], Any]:
        x = tf.constant(rng.standard_normal((16, 32, 32, 64)), tf.float32)
        scale, offset = tf.ones([64]), tf.zeros([64])
        mean, variance = tf.zeros([64]), tf.ones([64])

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                tape.watch([x, scale, offset])
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                    x, scale, offset, mean=mean, variance=variance, is_training=False
                )
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, [x, scale, offset])

        return step

    def sparse_update_step() -> Callable[[], Any]:
        import tf_keras

        variable = tf.Variable(rng.standard_normal((20000, 64)).astype(np.float32))
        optimizer = tf_keras.optimizers.Adam(1e-3)
        values = tf.constant(rng.standard_normal((2048, 64)).astype(np.float32))
        indices = tf.constant(rng.integers(0, 20000, 2048), tf.int64)

        @tf.function
        def step() -> Any:
            grad = tf.IndexedSlices(values, indices, tf.constant([20000, 64], tf.int64))
            return optimizer.apply_gradients([(grad, variable)])

        return step

    def crop_step() -> Callable[[], Any]:
        image = tf.constant(rng.standard_normal((4, 64, 64, 32)), tf.float32)
        corners = rng.uniform(0, 1, (128, 2, 2))
        boxes = tf.constant(
            np.concatenate([corners.min(1), corners.max(1)], 1), tf.float32
        )
        box_ind = tf.constant(rng.integers(0, 4, 128), tf.int32)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                tape.watch([image, boxes])
                crops = tf.image.crop_and_resize(image, boxes, box_ind, (7, 7))
                loss = tf.reduce_sum(crops * crops)
            return tape.gradient(loss, [image, boxes])

        return step

    def sparse_matmul_step() -> Callable[[], Any]:
        nnz = 20000
        indices = np.unique(
            np.stack([rng.integers(0, 2048, nnz), rng.integers(0, 4096, nnz)], 1),
            axis=0,
        )
        values = tf.constant(rng.standard_normal(len(indices)), tf.float32)
        dense = tf.constant(rng.standard_normal((4096, 64)), tf.float32)
        indices = tf.constant(indices, tf.int64)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                tape.watch([values, dense])
                sparse = tf.SparseTensor(indices, values, [2048, 4096])
                product = tf.sparse.sparse_dense_matmul(sparse, dense)
                loss = tf.reduce_sum(product * product)
            return tape.gradient(loss, [values, dense])

        return step

    def elementwise_step(function: Callable[[Any], Any]) -> Callable[[], Any]:
        # BatchNormalization-sized activations: [32,32,32,64] = 2M floats.
        x = tf.constant(rng.uniform(0.1, 4, (32, 32, 32, 64)), tf.float32)

        def make() -> Callable[[], Any]:
            @tf.function
            def step() -> Any:
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(function(x))
                return tape.gradient(loss, x)

            return step

        return make

    def softmax_step() -> Callable[[], Any]:
        logits = tf.constant(rng.standard_normal((4096, 512)), tf.float32)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                tape.watch(logits)
                loss = tf.reduce_sum(tf.nn.softmax(logits) * logits)
            return tape.gradient(loss, logits)

        return step

    def matmul_step() -> Callable[[], Any]:
        a = tf.constant(rng.standard_normal((512, 2048)), tf.float32)
        b = tf.constant(rng.standard_normal((2048, 512)), tf.float32)

        # Arguments, not captured constants, which Grappler would fold away.
        @tf.function
        def step(a: Any, b: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(b)
                loss = tf.reduce_sum(tf.square(tf.matmul(a, b)))
            return tape.gradient(loss, b)

        return lambda: step(a, b)

    def gradients_step(
        shapes: list[tuple[int, ...]], function: Callable[..., Any]
    ) -> Callable[[], Callable[[], Any]]:
        """`function(*inputs)` forward and its gradient to every input."""
        inputs = [
            tf.constant(rng.standard_normal(shape) / np.sqrt(shape[-1]), tf.float32)
            for shape in shapes
        ]

        def make() -> Callable[[], Any]:
            # Arguments, not captured constants, which Grappler would fold away.
            @tf.function
            def step(*inputs: Any) -> Any:
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    loss = tf.reduce_sum(tf.square(function(*inputs)))
                return tape.gradient(loss, inputs)

            return lambda: step(*inputs)

        return make

    def max_pool_xla_step() -> Callable[[], Any]:
        x = tf.constant(rng.standard_normal((16, 32, 32, 32)), tf.float32)

        # Compiled with XLA: the only place the patch changes the gradient.
        # `x` is an argument: XLA would fold a captured constant away.
        @tf.function(jit_compile=True)
        def compiled(x: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.nn.max_pool2d(x, 3, 2, "SAME")
                # Inside the tape: outside, the gradient was None and only the
                # forward pass was timed.
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, x)

        return lambda: compiled(x)

    # The built-in CNN's (CIFAR-10, batch 64) and an attention block's shapes.
    products = [
        (
            "conv 3x3 32->64 SAME fwd+bwd, [64,15,15,32] (the built-in CNN's third "
            "layer: Conv2DBackpropFilter)",
            [(64, 15, 15, 32), (3, 3, 32, 64)],
            lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
        ),
        (
            "conv 3x3 3->32 SAME fwd+bwd, [64,32,32,3] (the built-in CNN's first layer)",
            [(64, 32, 32, 3), (3, 3, 3, 32)],
            lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
        ),
        (
            "dense fwd+bwd, [64,2304]@[2304,512] (the built-in CNN's first Dense: "
            "MatMul)",
            [(64, 2304), (2304, 512)],
            tf.matmul,
        ),
        (
            "bias add fwd+bwd, [64,30,30,32] (BiasAddGrad)",
            [(64, 30, 30, 32), (32,)],
            tf.nn.bias_add,
        ),
        (
            "attention scores and values fwd+bwd, batch 32, 4 heads, 64 positions, "
            "key dim 32 (Einsum, BatchMatMul)",
            [(32, 64, 4, 32), (32, 64, 4, 32)],
            lambda q, k: tf.einsum(
                "acbe,aecd->abcd",
                tf.nn.softmax(tf.einsum("aecd,abcd->acbe", k, q)),
                k,
            ),
        ),
    ]
    return [
        *(
            Case("pool_size_free_products", description, gradients_step(shapes, f))
            for description, shapes, f in products
        ),
        Case(
            "xla_max_pool_grad",
            "max_pool 3x3/2 SAME fwd+bwd under XLA, [16,32,32,32] (original "
            "compiled without op determinism, which refuses it)",
            max_pool_xla_step,
            original_refused=True,
        ),
        Case(
            "portable_rsqrt",
            "rsqrt fwd+bwd, [32,32,32,64]",
            elementwise_step(lambda t: tf.math.rsqrt(t)),
        ),
        Case(
            "portable_reciprocal",
            "reciprocal fwd+bwd, [32,32,32,64]",
            elementwise_step(lambda t: tf.math.reciprocal(t)),
        ),
        Case(
            "portable_erfc",
            "exact GELU (erfc) fwd+bwd, [32,32,32,64]",
            elementwise_step(lambda t: tf.nn.gelu(t, approximate=False)),
        ),
        Case("portable_softmax", "softmax fwd+bwd, [4096,512]", softmax_step),
        Case(
            "eigen_cache_sizes",
            "matmul fwd+bwd, [512,2048]@[2048,512] (Eigen's where oneDNN's "
            "custom ops are off)",
            matmul_step,
            at_run_time=True,
        ),
        Case(
            "resize_nearest_grad",
            "resize nearest 32->64 fwd+bwd, [16,32,32,16]",
            resize_step,
        ),
        Case("bincount", "bincount axis=-1, [256,64] values, 1000 bins", bincount_step),
        Case(
            "confusion_matrix_scatter",
            "confusion_matrix, 65536 labels, 21 classes",
            confusion_step,
        ),
        Case("adjust_contrast", "adjust_contrast, [32,64,64,3]", contrast_step),
        Case(
            "fused_batch_norm_frozen",
            "frozen fused BN fwd+bwd, [16,32,32,64]",
            batch_norm_step,
        ),
        Case(
            "sparse_optimizer_update",
            "tf_keras Adam, IndexedSlices 2048 of 20000x64",
            sparse_update_step,
        ),
        Case(
            "crop_and_resize_grad",
            "crop_and_resize 128 boxes 7x7 fwd+bwd, [4,64,64,32]",
            crop_step,
        ),
        Case(
            "sparse_dense_matmul",
            "sparse [2048,4096] ~20k nnz @ [4096,64] fwd+bwd",
            sparse_matmul_step,
        ),
    ]


def _time(step: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        result = step()
    # Force completion of the last call before stopping the clock.
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)
    return (time.perf_counter() - start) / iterations


def measure(case: Case, rounds: int, iterations: int) -> dict[str, Any]:
    """Times the original and the patched entry point, taking turns."""
    from tfdet._patching import _registry

    patch = _registry.available()[case.patch]
    patch.restore()
    import tensorflow as tf

    original = case.make()
    from tensorflow.python.framework import config

    if case.original_refused:
        config.disable_op_determinism()
    try:
        original()  # Trace and warm up with TensorFlow's op.
    finally:
        tf.config.experimental.enable_op_determinism()
    patch.install()
    try:
        patched = case.make()
        patched()  # Traced with the patch in place.
    finally:
        patch.restore()
    # Both functions are traced; installing or restoring does not change
    # them, except for a patch that acts at run time.
    samples_original, samples_patched, ratios = [], [], []
    for _ in range(rounds):
        a = _time(original, iterations)
        if case.at_run_time:
            patch.install()
        try:
            b = _time(patched, iterations)
        finally:
            patch.restore()
        samples_original.append(a)
        samples_patched.append(b)
        ratios.append(b / a)
    return {
        "patch": case.patch,
        "case": case.description,
        "original_ms": 1e3 * statistics.median(samples_original),
        "patched_ms": 1e3 * statistics.median(samples_patched),
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=1, help="TF intra/inter-op threads."
    )
    parser.add_argument(
        "--patch", action="append", help="Only this patch's cases (repeatable)."
    )
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.config.experimental.enable_op_determinism()

    from tfdet._patching import _registry

    cases = _cases()
    registered = _registry.available()
    unknown = sorted({case.patch for case in cases} - set(registered))
    if unknown:
        raise SystemExit(f"Expected cases for registered patches. Received: {unknown}")
    if args.patch:
        cases = [case for case in cases if case.patch in args.patch]
    # In the registry's order; a patch may have several cases.
    rows = [
        measure(case, args.rounds, args.iterations)
        for name in registered
        for case in cases
        if case.patch == name
    ]
    cases_of = {case.patch for case in cases}
    without = [
        name
        for name in registered
        if name not in cases_of and (not args.patch or name in args.patch)
    ]
    print(
        f"patch cost on CPU, TF {tf.__version__}, threads={args.threads}, "
        f"median of {args.rounds} rounds x {args.iterations} calls"
    )
    print(f"{'patch':<26} {'original ms':>12} {'patched ms':>11} {'ratio':>6}  case")
    for row in rows:
        print(
            f"{row['patch']:<26} {row['original_ms']:>12.3f} {row['patched_ms']:>11.3f} "
            f"{row['ratio']:>6.2f}  {row['case']}"
        )
    for name in without:
        print(f"{name:<26} {'-':>12} {'-':>11} {'-':>6}  no case here")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
