"""Deterministic gradient of a frozen fused batch norm (`is_training=False`).

TensorFlow raises `UnimplementedError` for `FusedBatchNormGrad*` with
`is_training=False` on GPU under op determinism
(tensorflow/tensorflow#50505). tf_keras' BatchNormalization is fused, so a BN
layer called with `training=False` while its scale and offset still train
(fine-tuning with frozen statistics) reaches it. This patch replaces the
gradients registered for `FusedBatchNorm`, `FusedBatchNormV2` and
`FusedBatchNormV3`: with `is_training=False` it computes the kernel's formulas
from deterministic ops (element-wise ops and `Sum`),

    dx      = dy * scale * rsqrt(var + epsilon)
    dscale  = sum(dy * (x - mean)) * rsqrt(var + epsilon)
    doffset = sum(dy)

in float32, as the kernel does; with `is_training=True` it defers to
TensorFlow's own gradient, which is deterministic.

Tolerance: `dx` is element-wise, but the kernel's rsqrt (Eigen's) and TF's
`Rsqrt` op may differ by an ulp, so `dx` agrees to a few ulps;
the two sums run in another order than the kernel's, so they agree to a few
float32 ulps of the sum of magnitudes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap, registered_gradient

# The forward ops whose registered gradients the patch replaces.
OP_TYPES = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def frozen_batch_norm_grad(
    grad_y: Any,
    x: Any,
    scale: Any,
    mean: Any,
    variance: Any,
    epsilon: float,
    data_format: str = "NHWC",
) -> tuple[Any, Any, Any]:
    """Gradients of `y = (x - mean) * rsqrt(variance + epsilon) * scale + offset`.

    Args:
        grad_y: Gradient of the output, shaped like `x`.
        x: The batch-norm input.
        scale: Per-channel scale, float32.
        mean: Per-channel population mean used by the forward pass.
        variance: Per-channel population variance used by the forward pass.
        epsilon: The forward op's epsilon.
        data_format: "NHWC", "NCHW", "NDHWC" or "NCDHW".

    Returns:
        `(dx, dscale, doffset)`; `dx` has `x`'s dtype, the others float32.
    """
    import tensorflow as tf

    if isinstance(data_format, bytes):
        data_format = data_format.decode()
    with tf.name_scope("DeterministicFrozenBatchNormGrad"):
        channel_axis = data_format.index("C")
        rank = len(data_format)
        axes = [axis for axis in range(rank) if axis != channel_axis]
        broadcast = [1] * rank
        broadcast[channel_axis] = -1
        dy = tf.cast(grad_y, tf.float32)
        inputs = tf.cast(x, tf.float32)
        inv = tf.math.rsqrt(tf.cast(variance, tf.float32) + epsilon)
        centered = inputs - tf.reshape(tf.cast(mean, tf.float32), broadcast)
        dx = dy * tf.reshape(tf.cast(scale, tf.float32) * inv, broadcast)
        dscale = tf.reduce_sum(dy * centered, axis=axes) * inv
        doffset = tf.reduce_sum(dy, axis=axes)
        return tf.cast(dx, x.dtype), dscale, doffset


def _frozen_only(original: Callable[..., Any]) -> Callable[..., Any]:
    """A fused-BN gradient: the patch's when frozen, else `original`."""

    def gradient(op: Any, *grads: Any) -> tuple[Any, ...]:
        if op.get_attr("is_training"):
            return original(op, *grads)
        dx, dscale, doffset = frozen_batch_norm_grad(
            grads[0],
            op.inputs[0],
            op.inputs[1],
            op.inputs[3],
            op.inputs[4],
            op.get_attr("epsilon"),
            op.get_attr("data_format"),
        )
        return dx, dscale, doffset, None, None

    return gradient


def _apply(swap: Swap) -> None:
    import tensorflow.python.ops.nn_grad  # noqa: F401  (registers the originals)

    for op_type in OP_TYPES:
        swap.gradient(op_type, _frozen_only(registered_gradient(op_type)))


PATCH = Patch(
    replaces=("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"),
    summary="FusedBatchNormGrad(is_training=False) -> element-wise ops + Sum",
    upstream="https://github.com/tensorflow/tensorflow/pull/50505",
    apply=_apply,
)
