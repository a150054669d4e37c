"""Fixed-order `Sum` and `Mean` (float32): `tf.reduce_sum`, `tf.reduce_mean`.

TensorFlow's CPU reductions (Eigen) add a row in as many interleaved
partial sums as a packet has lanes (8 on AVX, 4 on NEON) and then split
long ones over the pool, so a sum's bits follow the architecture (measured
under QEMU's aarch64 emulation: the sum of a 32x64 tensor's rows, or of
12,288 elements, differ) and may follow the pool. Softmax's and
LayerNormalization's sums, batch normalization's moments, the means of
losses and metrics all go through these two ops.

Here each is tfdet's op `TfdetFixedOrderSum` (`tfdet._kernels.portable_math`):
the reduced axes are made one (transposed together first where they are
not adjacent), and the sum runs in blocks whose number and bounds follow
the shape alone, each block's partials in row order, the blocks added
pairwise; the mean divides the sum by the count, correctly rounded, as
TensorFlow's does. So the bits follow neither the architecture, nor the
vector width, nor the pool; a row's sum does not follow how many other rows
the tensor has (the batch). The values differ from TensorFlow's by the
rounding of another order. The gradient is TensorFlow's: the upstream
gradient broadcast (over the count for the mean).

Other dtypes, axes not known when the graph is built, and a process where
the library cannot be loaded keep TensorFlow's ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tfdet._kernels import portable_math
from tfdet.patches import _exact_math
from tfdet.patches._registry import Patch

_MATH = "tensorflow.python.ops.gen_math_ops"
SUM = _exact_math.GeneratedOp(_MATH, "_sum")
MEAN = _exact_math.GeneratedOp(_MATH, "mean")


def _reduced_axes(axis: Any, rank: int) -> list[int] | None:
    """The axes `axis` names, each once and in order, or None where they are
    not known now or TensorFlow must say what is wrong with them."""
    import numpy as np
    import tensorflow as tf

    value = tf.get_static_value(axis)
    if value is None:
        return None
    named = np.ravel(value)
    if named.dtype.kind not in "iu" or any(not -rank <= a < rank for a in named):
        return None
    return sorted({int(a) % rank for a in named})


def _dimensions(tensor: Any) -> list[Any]:
    """The tensor's dimensions: Python ints where known, else tensors."""
    import tensorflow as tf

    if tensor.shape.is_fully_defined():
        return tensor.shape.as_list()
    dynamic = tf.shape(tensor)
    return [d if d is not None else dynamic[i] for i, d in enumerate(tensor.shape)]


def _product(dimensions: list[Any]) -> Any:
    import tensorflow as tf

    if all(isinstance(d, int) for d in dimensions):
        return math.prod(dimensions)
    return tf.reduce_prod(tf.stack(dimensions))


def fixed_order_reduce(
    library: Any, tensor: Any, axes: list[int], keep_dims: bool, mean: bool
) -> Any:
    """The sum (or the mean) of a float32 `tensor` over `axes` (sorted, each
    once, at least one) by the library's op, shaped as TensorFlow's."""
    import tensorflow as tf

    rank = tensor.shape.rank
    original = dimensions = _dimensions(tensor)
    kept = [d for d in range(rank) if d not in axes]
    if axes == list(range(axes[0], axes[-1] + 1)):
        first, last, adjacent = axes[0], axes[-1] + 1, tensor
    else:  # Made adjacent, last: the kept axes keep their order.
        first, last = len(kept), rank
        adjacent = tf.transpose(tensor, kept + axes)
        dimensions = [dimensions[d] for d in kept + axes]
    view = [
        _product(dimensions[:first]),
        _product(dimensions[first:last]),
        _product(dimensions[last:]),
    ]
    summed = library.tfdet_fixed_order_sum(tf.reshape(adjacent, view), mean=mean)
    if keep_dims:
        shape = [1 if d in axes else original[d] for d in range(rank)]
        static = [1 if d in axes else tensor.shape[d] for d in range(rank)]
    else:
        shape, static = [original[d] for d in kept], [tensor.shape[d] for d in kept]
    result = tf.reshape(summed, shape)
    result.set_shape(static)
    return result


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
        rank = tensor.shape.rank
        axes = None if rank is None else _reduced_axes(axis, rank)
        if not axes:
            return generated.original(input, axis, keep_dims=keep_dims, name=name)
        scope = name or ("FixedOrderMean" if mean else "FixedOrderSum")
        with tf.name_scope(scope):
            return fixed_order_reduce(library, tensor, axes, keep_dims, mean)

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
