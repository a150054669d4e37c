"""Deterministic contrast adjustment (`AdjustContrastv2`).

TensorFlow raises `UnimplementedError` for `AdjustContrastv2` on GPU under op
determinism (tensorflow/tensorflow#51140; reported from Keras in
keras-team/keras#19197). `tf.image.adjust_contrast`,
`tf.image.(stateless_)random_contrast` and tf_keras `RandomContrast` reach it
through `gen_image_ops.adjust_contrastv2`, which this patch replaces with the
same formula in deterministic ops: the per-image, per-channel mean over height
and width (`Sum`, deterministic on GPU), then `(x - mean) * factor + mean`,
computed in float32 as the kernel does.

Tolerance: the kernel sums the pixels in its own order, so the mean can differ
in the last bits; results agree to a few float32 ulps of the inputs' scale.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def adjust_contrastv2(
    images: Any, contrast_factor: Any, name: str | None = None
) -> Any:
    """Deterministic `tf.raw_ops.AdjustContrastv2`.

    Example:

    >>> import tensorflow as tf
    >>> x = tf.reshape(tf.range(4.0), [2, 2, 1])
    >>> adjust_contrastv2(x, 2.0)[..., 0].numpy().tolist()
    [[-1.5, 0.5], [2.5, 4.5]]

    Args:
        images: Float images `[..., height, width, channels]`, rank >= 3.
        contrast_factor: Scalar multiplier of each pixel's distance from the
            mean of its image and channel.
        name: Name scope.

    Returns:
        The adjusted images, of `images`' dtype.

    Raises:
        ValueError / InvalidArgumentError: rank below 3 or a non-scalar
            factor, as the original.
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicAdjustContrastv2"):
        images = tf.convert_to_tensor(images)
        factor = tf.convert_to_tensor(contrast_factor, dtype=tf.float32)
        rank = images.shape.rank
        if rank is not None and rank < 3:
            message = f"input must be at least 3-D, got shape {images.shape}"
            if tf.executing_eagerly():
                raise tf.errors.InvalidArgumentError(None, None, message)
            raise ValueError(message)
        if factor.shape.rank is not None and factor.shape.rank != 0:
            message = f"contrast_factor must be scalar: {factor.shape}"
            if tf.executing_eagerly():
                raise tf.errors.InvalidArgumentError(None, None, message)
            raise ValueError(message)
        # The kernel computes in float32 whatever the input's float type.
        values = tf.cast(images, tf.float32)
        mean = tf.reduce_mean(values, axis=[-3, -2], keepdims=True)
        adjusted = (values - mean) * factor + mean
        return tf.cast(adjusted, images.dtype)


def _apply(swap: Swap) -> None:
    from tensorflow.python.ops import gen_image_ops

    swap.attribute(gen_image_ops, "adjust_contrastv2", adjust_contrastv2)


PATCH = Patch(
    replaces=("AdjustContrastv2",),
    summary="AdjustContrastv2 -> Mean, Sub, Mul, AddV2",
    upstream="https://github.com/tensorflow/tensorflow/pull/51140",
    apply=_apply,
)
