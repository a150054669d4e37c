"""Portable `tf.nn.softmax` (`Softmax`): `exp(x - max) / sum(exp(x - max))`.

TensorFlow's CPU Softmax kernel multiplies by `sum.inverse()`, which Eigen
computes for float32 with the x86 approximate instruction RCPPS plus a
Newton step: its last bits depend on the CPU model (Intel, AMD and QEMU
differ). Every Keras softmax (activations, attention, `keras.ops.softmax`)
goes through `gen_nn_ops.softmax`; this patch replaces it with the same
formula divided by the sum with a correctly rounded division. The sum runs
in `Sum`'s order rather than the kernel's, so values agree with the original
to a few ulps. The gradient is the original's formula,
`(dy - sum(dy * y)) * y` (multiplications and a sum). See
`tfdet._patching._exact_math`.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_SOFTMAX = _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", "softmax")


def softmax(logits: Any, name: str | None = None) -> Any:
    """Softmax over the last axis, division correctly rounded (`tf.raw_ops.Softmax`).

    Example:

    >>> softmax([[0.0, 0.0]]).numpy().tolist()
    [[0.5, 0.5]]

    Args:
        logits: A float tensor of rank 1 or more.
        name: Name scope.
    """
    return _exact_math.portable_op(
        logits, name, "PortableSoftmax", _SOFTMAX.original, _forward, _gradient
    )


def _forward(value: Any) -> Any:
    import tensorflow as tf
    from tensorflow.python.ops import gen_math_ops

    exps = tf.exp(value - tf.reduce_max(value, axis=-1, keepdims=True))
    # exps follow the logits, never a constant Grappler could fold to ones.
    return gen_math_ops.real_div(exps, tf.reduce_sum(exps, axis=-1, keepdims=True))


def _gradient(value: Any, result: Any, upstream: Any) -> Any:
    import tensorflow as tf

    # TensorFlow's registered Softmax gradient (nn_grad._SoftmaxGrad).
    total = tf.reduce_sum(upstream * result, axis=-1, keepdims=True)
    return (upstream - total) * result


PATCH = Patch(
    replaces=("Softmax",),
    summary="Softmax (RCPPS in sum.inverse(), CPU-model dependent) -> Exp / Sum",
    upstream="https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/kernels/softmax_op_functor.h",
    apply=lambda swap: _SOFTMAX.replace(swap, softmax),
)
