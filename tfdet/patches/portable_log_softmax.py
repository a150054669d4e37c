"""Portable `tf.nn.log_softmax` (`LogSoftmax`): `x - max - log(sum(exp(x - max)))`.

TensorFlow's CPU LogSoftmax kernel computes that formula with Eigen's own
exp, sum and log, whose bits differ between x86-64 and aarch64 (measured
under QEMU's aarch64 emulation on 32x64 random logits; see
`tfdet.patches.portable_math` and `tfdet.patches.fixed_order_sums`). Here it
is the same formula, step for step, over the portable exp and log and the
fixed-order sum, so it gives the same bits on both. Its gradient is
TensorFlow's registered one (`nn_grad._LogSoftmaxGrad`):
`dy - sum(dy) * exp(y)`.

Installed by "auto" (CPU) where the portable math library loads (else
TensorFlow's op runs, whose bits the composition would not make portable).
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels import portable_math
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_LOG_SOFTMAX = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "log_softmax"
)


def log_softmax(logits: Any, name: str | None = None) -> Any:
    """Log-softmax over the last axis (`tf.raw_ops.LogSoftmax`), float32.

    Example:

    >>> float(log_softmax([[0.0, 0.0]])[0, 0])  # doctest: +ELLIPSIS
    -0.693...

    Args:
        logits: A float tensor of rank 1 or more.
        name: Name scope.
    """
    if portable_math.LIBRARY.load() is None:
        return _LOG_SOFTMAX.original(logits, name=name)
    return _exact_math.portable_op(
        logits,
        name,
        "PortableLogSoftmax",
        _LOG_SOFTMAX.original,
        _forward,
        _gradient,
        dtypes=("float32",),
    )


def _forward(value: Any) -> Any:
    import tensorflow as tf

    shifted = value - tf.reduce_max(value, axis=-1, keepdims=True)
    return shifted - tf.math.log(tf.reduce_sum(tf.exp(shifted), axis=-1, keepdims=True))


def _gradient(value: Any, result: Any, upstream: Any) -> Any:
    import tensorflow as tf

    return upstream - tf.reduce_sum(upstream, axis=-1, keepdims=True) * tf.exp(result)


PATCH = Patch(
    replaces=("LogSoftmax",),
    summary="LogSoftmax (Eigen's exp, sum and log) -> the same formula over the "
    "portable functions and the fixed-order sum",
    upstream="https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/kernels/softmax_op_functor.h",
    apply=lambda swap: _LOG_SOFTMAX.replace(swap, log_softmax),
    cpu_only=True,
    kernel=portable_math.LIBRARY,
)
