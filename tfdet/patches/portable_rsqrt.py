"""Portable `tf.math.rsqrt` (`Rsqrt`): `1 / sqrt(x)`, the same on every CPU.

Eigen's float32 `Rsqrt` kernel uses the x86 approximate instruction RSQRTPS
plus a Newton step, whose last bits depend on the CPU model (Intel, AMD and
QEMU differ); it is not correctly rounded. Keras 3's BatchNormalization (TF
backend, `tf.nn.batch_normalization`) and LayerNormalization reach it, so a
model trained on an AMD and on an Intel CPU gets other weights. This patch
replaces `gen_math_ops.rsqrt` with `1 / sqrt(x)`: IEEE square root and
division are correctly rounded, hence bit-identical on every CPU, and the
result is within an ulp of the exact value (the kernel's is within ~2).
The gradient is TensorFlow's own `RsqrtGrad` of the output (multiplications
only), as for the original op. See `tfdet._patching._exact_math`.
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels.portable_math import divide
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_RSQRT = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "rsqrt")


def rsqrt(x: Any, name: str | None = None) -> Any:
    """`1 / sqrt(x)` with correctly rounded operations (`tf.raw_ops.Rsqrt`).

    Example:

    >>> rsqrt([4.0, 0.25]).numpy().tolist()
    [0.5, 2.0]

    Args:
        x: A tensor; float dtypes are computed here, others by the original.
        name: Name scope.
    """
    return _exact_math.portable_op(
        x, name, "PortableRsqrt", _RSQRT.original, _forward, _gradient
    )


def _forward(value: Any) -> Any:
    import tensorflow as tf

    sqrt = _exact_math.opaque(tf.sqrt(value))
    return divide(1.0, sqrt)


def _gradient(value: Any, result: Any, upstream: Any) -> Any:
    from tensorflow.python.ops import gen_math_ops

    return gen_math_ops.rsqrt_grad(result, upstream)


PATCH = Patch(
    replaces=("Rsqrt",),
    summary="Rsqrt (RSQRTPS, CPU-model dependent) -> 1 / Sqrt",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/Eigen/src/Core/arch/AVX/MathFunctions.h",
    apply=lambda swap: _RSQRT.replace(swap, rsqrt),
)
