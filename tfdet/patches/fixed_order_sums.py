"""Fixed-order `Sum` and `Mean` (float32): `tf.reduce_sum`, `tf.reduce_mean`.

TensorFlow's CPU reductions (Eigen) add a row in as many interleaved
partial sums as a packet has lanes (8 on AVX, 4 on NEON) and then split
long ones over the pool, so a sum's bits follow the architecture (measured
under QEMU's aarch64 emulation: the sum of a 32x64 tensor's rows, or of
12,288 elements, differ) and may follow the pool. Softmax's and
LayerNormalization's sums, batch normalization's moments, the means of
losses and metrics all go through these two ops.

Here each is tfdet's op `TfdetFixedOrderSum` (`tfdet._kernels.portable_math`),
with the op's own arguments (the axes may be known only when it runs, as
in the gradient of a broadcast addition): the reduced axes are made one
(transposed after the kept ones where they are not adjacent), and the sum
runs in blocks whose number and bounds follow
the shape alone, each block's partials in row order, the blocks added
pairwise; the mean divides the sum by the count, correctly rounded, as
TensorFlow's does. So the bits follow neither the architecture, nor the
vector width, nor the pool; a row's sum does not follow how many other rows
the tensor has (the batch). The values differ from TensorFlow's by the
rounding of another order. The gradient is TensorFlow's: the upstream
gradient broadcast (over the count for the mean).

Other dtypes, and a process where the library cannot be loaded, keep
TensorFlow's ops; axes out of range raise TensorFlow's error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdet._kernels import portable_math
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_MATH = "tensorflow.python.ops.gen_math_ops"
SUM = _exact_math.GeneratedOp(_MATH, "_sum")
MEAN = _exact_math.GeneratedOp(_MATH, "mean")


def _replacement(generated: _exact_math.GeneratedOp, mean: bool) -> Callable[..., Any]:
    def replacement(
        input: Any,  # noqa: A002 (TensorFlow's name)
        axis: Any,
        keep_dims: bool = False,
        name: Any = None,
    ) -> Any:
        import tensorflow as tf

        library = portable_math.LIBRARY.load()
        tensor = _exact_math.dense_float(input)
        if library is None or tensor is None or tensor.dtype != tf.float32:
            return generated.original(input, axis, keep_dims=keep_dims, name=name)
        return library.tfdet_fixed_order_sum(
            tensor, axis, keep_dims=keep_dims, mean=mean, name=name
        )

    return replacement


def _apply(swap: Any) -> None:
    import tensorflow as tf

    portable_math.LIBRARY.load()
    # As in portable_math: AutoGraph leaves them as they are.
    plain = tf.autograph.experimental.do_not_convert
    SUM.replace(swap, plain(_replacement(SUM, mean=False)))
    MEAN.replace(swap, plain(_replacement(MEAN, mean=True)))


PATCH = Patch(
    replaces=("Sum", "Mean"),
    summary="Sum, Mean (float32) -> one sum in an order fixed by the shape "
    "(blocks, rows in order, blocks pairwise): the same bits on x86-64 and "
    "aarch64, any pool, any batch",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/unsupported/Eigen/CXX11/src/Tensor/TensorReduction.h",
    apply=_apply,
    cpu_only=True,
    kernel=portable_math.LIBRARY,
)
