"""Portable `tf.math.reciprocal` (`Reciprocal`, `Inv`): a true `1 / x`.

Eigen's float32 reciprocal kernel uses the x86 approximate instruction RCPPS
plus a Newton step, whose last bits depend on the CPU model (Intel, AMD and
QEMU differ). This patch replaces `gen_math_ops.reciprocal` and
`gen_math_ops.inv` (and every binding of them: `tf.math.reciprocal` is the
generated function itself) with a correctly rounded division, bit-identical
on every CPU. The gradient is TensorFlow's own `ReciprocalGrad` of the output
(multiplications only). Integer and complex inputs keep the original op. See
`tfdet._patching._exact_math`.
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels.portable_math import divide
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap

_OPS = "tensorflow.python.ops.gen_math_ops"
_RECIPROCAL = _exact_math.GeneratedOp(_OPS, "reciprocal")
_INV = _exact_math.GeneratedOp(_OPS, "inv")


def _portable(x: Any, name: str | None, op: _exact_math.GeneratedOp) -> Any:
    return _exact_math.portable_op(
        x, name, "PortableReciprocal", op.original, _forward, _gradient
    )


def _forward(value: Any) -> Any:
    return divide(1.0, value)


def _gradient(value: Any, result: Any, upstream: Any) -> Any:
    from tensorflow.python.ops import gen_math_ops

    return gen_math_ops.reciprocal_grad(result, upstream)


def reciprocal(x: Any, name: str | None = None) -> Any:
    """`1 / x` with one correctly rounded division (`tf.raw_ops.Reciprocal`).

    Example:

    >>> reciprocal([4.0, 0.0]).numpy().tolist()
    [0.25, inf]

    Args:
        x: A tensor; float dtypes are computed here, others by the original.
        name: Name scope.
    """
    return _portable(x, name, _RECIPROCAL)


def inv(x: Any, name: str | None = None) -> Any:
    """`1 / x` (`tf.raw_ops.Inv`, the deprecated name of Reciprocal)."""
    return _portable(x, name, _INV)


def _apply(swap: Swap) -> None:
    _RECIPROCAL.replace(swap, reciprocal)
    _INV.replace(swap, inv)


PATCH = Patch(
    replaces=("Reciprocal", "Inv"),
    summary="Reciprocal/Inv (RCPPS, CPU-model dependent) -> 1 / x",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/Eigen/src/Core/arch/AVX/MathFunctions.h",
    apply=_apply,
)
