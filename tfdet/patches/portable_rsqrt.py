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
only), as for the original op. See `tfdet.patches._exact_math`.
"""

from __future__ import annotations

from typing import Any

from tfdet._graph._patching import Patch
from tfdet.patches import _exact_math
from tfdet.patches._swap import Swap

_ORIGINAL: list[Any] = []
_OPS = "tensorflow.python.ops.gen_math_ops"


def rsqrt(x: Any, name: str | None = None) -> Any:
    """`1 / sqrt(x)` with correctly rounded operations (`tf.raw_ops.Rsqrt`).

    Example:

    >>> rsqrt([4.0, 0.25]).numpy().tolist()
    [0.5, 2.0]

    Args:
        x: A tensor; float dtypes are computed here, others by the original.
        name: Name scope.
    """
    import tensorflow as tf
    from tensorflow.python.ops import gen_math_ops

    tensor = _exact_math.dense_float(x)
    if tensor is None:
        return _ORIGINAL[0](x, name=name)

    @tf.custom_gradient
    def forward(value: Any) -> Any:
        result = _exact_math.divide(
            _exact_math.ones(value), _exact_math.opaque(tf.sqrt(value))
        )
        return result, lambda upstream: gen_math_ops.rsqrt_grad(result, upstream)

    with tf.name_scope(name or "PortableRsqrt"):
        return forward(tensor)


def _apply(swap: Swap) -> None:
    _ORIGINAL[:] = [_exact_math.swap_everywhere(swap, _OPS, "rsqrt", rsqrt)]


PATCH = Patch(
    replaces=("Rsqrt",),
    summary="Rsqrt (RSQRTPS, CPU-model dependent) -> 1 / Sqrt",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/Eigen/src/Core/arch/AVX/MathFunctions.h",
    apply=_apply,
)
