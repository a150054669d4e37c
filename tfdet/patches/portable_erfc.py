"""Portable `tf.math.erfc` (`Erfc`), and with it exact GELU, on every CPU.

Eigen's float32 erfc (`generic_fast_erfc<float>`) computes `1/x^2` with
`preciprocal`, i.e. the x86 approximate instruction RCPPS plus a Newton
step, whose last bits depend on the CPU model (Intel, AMD and QEMU differ).
Exact GELU (`tf.nn.gelu(approximate=False)`, Keras' `gelu` activation's
default in Keras 3) is `0.5 * x * erfc(-x / sqrt(2))`, so it reaches it.
This patch replaces `gen_math_ops.erfc` (and its second copy `math_ops.erfc`)
with the same algorithm written in TensorFlow ops, the reciprocal taken by a
correctly rounded division:

    |x| <= 1:  erfc(x) = 1 + x * S(x^2)
    |x| >  1:  erfc(x) = exp(-x^2) (1 - lo(x^2)) P(1/x^2) / (x Q(1/x^2)) (+2 if x < 0)

with Eigen's coefficients, `x` clamped to [-11, 11], and `lo(x^2)` the exact
rounding error of `x*x` (taken in float64, where the product of two float32
is exact). Each step is an IEEE correctly rounded operation or `Exp`, whose
bits were measured equal across CPU models, so the result is bit-identical
on every CPU and within a few ulps of the kernel's (its error bound is
Eigen's, below 5 ulps). float16 / bfloat16 are computed in float32; float64
keeps the original kernel (no approximate double instruction below
AVX-512). The gradient is the original's formula,
`dy * -2/sqrt(pi) * exp(-x^2)`. See `tfdet._patching._exact_math`.

Needed from TensorFlow 2.20, whose Eigen has that algorithm: up to 2.19
TensorFlow's Erfc (and Erf, which its exact GELU takes up to 2.18) gave the
same bits on an AMD EPYC Zen 3 and on QEMU's emulated Haswell-v4, so
`enable()` leaves them alone there (the hazard table's row says which
versions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tfdet._kernels.portable_math import divide
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_ERFC = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "erfc")
# `erfc_float32` as one op of tfdet's own, with its bits (float32 in, out),
# while the opt-in `portable_kernels` patch is installed; else None.
kernel: Callable[[Any], Any] | None = None


# Eigen's generic_fast_erfc<float> (SpecialFunctionsImpl.h), highest degree first.
_CLAMP = 11.0
_ALPHA = (
    5.61802298761904239654541015625e-04,
    -4.91381669417023658752441406250e-03,
    2.67075151205062866210937500000e-02,
    -1.12800106406211853027343750000e-01,
    3.76122951507568359375000000000e-01,
    -1.12837910652160644531250000000e00,
)
_GAMMA = (
    1.0208116471767425537109375e-01,
    4.2920666933059692382812500e-01,
    3.2379078865051269531250000e-01,
    5.3971976041793823242187500e-02,
)
_DELTA = (
    1.7251677811145782470703125e-02,
    3.9137163758277893066406250e-01,
    1.0000000000000000000000000e00,
    6.2173241376876831054687500e-01,
    9.5662862062454223632812500e-02,
)


def _horner(x: Any, coefficients: tuple[float, ...]) -> Any:
    # Multiply then add, as Eigen's ppolevl does without FMA (the
    # TensorFlow wheel's Eigen kernels are built without it).
    result = x * coefficients[0] + coefficients[1]
    for coefficient in coefficients[2:]:
        result = result * x + coefficient
    return result


def erfc_float32(x: Any) -> Any:
    """Eigen's float32 erfc algorithm with correctly rounded operations."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_math_ops

    x = tf.clip_by_value(x, -_CLAMP, _CLAMP)
    x2 = x * x
    small = x * _horner(x2, _ALPHA) + 1.0
    wide = tf.cast(x, tf.float64)
    x2_lo = tf.cast(wide * wide - tf.cast(x2, tf.float64), tf.float32)
    exp2_hi = tf.exp(-x2)
    z = exp2_hi - exp2_hi * x2_lo
    q2 = divide(1.0, x2)
    ratio = gen_math_ops.real_div(_horner(q2, _GAMMA), x * _horner(q2, _DELTA))
    large = z * ratio + tf.where(x < 0.0, 2.0, 0.0)
    return tf.where(x2 > 1.0, large, small)


def erfc(x: Any, name: str | None = None) -> Any:
    """Complementary error function, the same bits on every CPU (`tf.raw_ops.Erfc`).

    Example:

    >>> erfc([0.0]).numpy().tolist()
    [1.0]

    Args:
        x: A tensor; float32, float16 and bfloat16 are computed here, float64
            by the original.
        name: Name scope.
    """
    return _exact_math.portable_op(
        x, name, "PortableErfc", _ERFC.original, _forward, _gradient, _COMPUTED_HERE
    )


# float64 stays with the original: the algorithm here is Eigen's float32 one.
_COMPUTED_HERE = ("bfloat16", "float16", "float32")


def _forward(value: Any) -> Any:
    import tensorflow as tf

    computed = erfc_float32 if kernel is None else kernel
    return tf.cast(computed(tf.cast(value, tf.float32)), value.dtype)


def _gradient(value: Any, result: Any, upstream: Any) -> Any:
    import tensorflow as tf

    # TensorFlow's registered Erfc gradient (math_grad._ErfcGrad).
    factor = tf.constant(-2 / math.sqrt(math.pi), dtype=upstream.dtype)
    return upstream * factor * tf.exp(-tf.square(value))


PATCH = Patch(
    replaces=("Erfc",),
    summary="Erfc (RCPPS inside, CPU-model dependent) -> Eigen's algorithm with a true division",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/unsupported/Eigen/src/SpecialFunctions/SpecialFunctionsImpl.h",
    apply=lambda swap: _ERFC.replace(swap, erfc),
)
