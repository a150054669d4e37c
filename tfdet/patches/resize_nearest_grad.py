"""Deterministic backprop of nearest-neighbour resizing.

TensorFlow's GPU kernel for `ResizeNearestNeighborGrad` accumulates with
atomics and raises `UnimplementedError` under op determinism
(tensorflow/tensorflow#51023). It is reached by `tf.image.resize(...,
"nearest")`, Keras 3 `Resizing(interpolation="nearest")` and tf_keras
`UpSampling2D`. This patch replaces the gradient registered for
`ResizeNearestNeighbor` with a sum over each input pixel's output pixels made
of deterministic GPU ops: the forward resize itself (to find each output
pixel's source, so the index arithmetic is the kernel's own), transposes and
`UnsortedSegmentSum` (sort-based and deterministic on GPU).
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def _source_index(
    in_size: Any, out_size: Any, align_corners: bool, half_pixel_centers: bool
) -> Any:
    """Input index that each of `out_size` output positions reads, on one axis."""
    import tensorflow as tf

    # A ramp 0..in_size-1 resized with the forward op: exact in float32 for
    # sizes below 2**24, and the mapping is the forward kernel's by definition.
    ramp = tf.reshape(tf.cast(tf.range(in_size), tf.float32), [1, in_size, 1, 1])
    resized = tf.raw_ops.ResizeNearestNeighbor(
        images=ramp,
        size=tf.stack([out_size, 1]),
        align_corners=align_corners,
        half_pixel_centers=half_pixel_centers,
    )
    return tf.cast(tf.reshape(resized, [out_size]), tf.int32)


def resize_nearest_neighbor_grad(
    grads: Any,
    size: Any,
    align_corners: bool = False,
    half_pixel_centers: bool = False,
    name: str | None = None,
) -> Any:
    """Deterministic `tf.raw_ops.ResizeNearestNeighborGrad`.

    Example:

    >>> import tensorflow as tf
    >>> g = tf.ones([1, 4, 4, 1])
    >>> resize_nearest_neighbor_grad(g, [2, 2])[0, :, :, 0].numpy().tolist()
    [[4.0, 4.0], [4.0, 4.0]]

    Args:
        grads: Gradient of the resized images, `[batch, out_h, out_w, channels]`.
        size: `[in_h, in_w]`, the size of the images before resizing.
        align_corners: As in the forward op.
        half_pixel_centers: As in the forward op.
        name: Name scope.

    Returns:
        The gradient of the original images, `[batch, in_h, in_w, channels]`,
        of `grads`' dtype.
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicResizeNearestNeighborGrad"):
        grads = tf.convert_to_tensor(grads)
        size = tf.cast(tf.convert_to_tensor(size), tf.int32)
        shape = tf.shape(grads)
        batch, out_h, out_w, channels = shape[0], shape[1], shape[2], shape[3]
        in_h, in_w = size[0], size[1]
        rows = _source_index(in_h, out_h, align_corners, half_pixel_centers)
        cols = _source_index(in_w, out_w, align_corners, half_pixel_centers)
        segments = rows[:, None] * in_w + cols[None, :]
        # Segment axes first: UnsortedSegmentSum reduces leading dimensions.
        data = tf.transpose(grads, [1, 2, 0, 3])
        summed = tf.math.unsorted_segment_sum(data, segments, in_h * in_w)
        result = tf.transpose(
            tf.reshape(summed, [in_h, in_w, batch, channels]), [2, 0, 1, 3]
        )
        static = grads.shape
        static_size = tf.get_static_value(size)
        if static_size is not None:
            result.set_shape(
                [static[0], int(static_size[0]), int(static_size[1]), static[3]]
            )
        return result


def _gradient(op: Any, grad: Any) -> list[Any]:
    import tensorflow as tf

    image = op.inputs[0]
    if image.shape[1:3].is_fully_defined():
        size = image.shape[1:3].as_list()
    else:
        size = tf.shape(image)[1:3]
    grads = resize_nearest_neighbor_grad(
        grad,
        size,
        align_corners=op.get_attr("align_corners"),
        half_pixel_centers=op.get_attr("half_pixel_centers"),
    )
    return [grads, None]


def _apply(swap: Swap) -> None:
    import tensorflow.python.ops.image_grad  # noqa: F401  (registers the original)

    swap.gradient("ResizeNearestNeighbor", _gradient)


PATCH = Patch(
    replaces=("ResizeNearestNeighborGrad",),
    summary="ResizeNearestNeighborGrad -> forward-resize index map + UnsortedSegmentSum",
    upstream="https://github.com/tensorflow/tensorflow/pull/51023",
    apply=_apply,
)
