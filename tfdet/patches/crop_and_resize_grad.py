"""Deterministic backprop of `tf.image.crop_and_resize`.

TensorFlow raises `UnimplementedError` for `CropAndResizeGradImage` and
`CropAndResizeGradBoxes` on GPU under op determinism
(tensorflow/tensorflow#42033). They are reached by the gradient of
`tf.image.crop_and_resize` (ROI pooling in detection models). This patch
replaces the gradient registered for `CropAndResize` with the CPU kernels'
arithmetic in deterministic ops:

- image: each crop pixel's gradient is split over its (up to) four source
  pixels with the kernel's bilinear weights, or sent to the nearest one, then
  summed per source pixel with `UnsortedSegmentSum` (sort-based and
  deterministic on GPU). The contributions are listed in the kernel's loop
  order (box, row, column, corner) and accumulated in the image dtype, as the
  kernel does, so on CPU the result is bit-identical.
- boxes: the kernel's per-pixel derivatives with respect to y1, x1, y2, x2,
  summed per box with `Sum` (deterministic on GPU). The kernel sums in its
  loop order, so these agree to a few ulps of the sum of magnitudes.

Crop pixels outside the image (extrapolated) get no gradient, and boxes whose
index is outside the batch are skipped, as in the kernels; the forward op has
already rejected invalid box indices with `OutOfRangeError`.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def _sample_positions(lo: Any, hi: Any, crop: Any, size: Any) -> tuple[Any, Any]:
    """Source coordinate of each crop row (or column), per box; and the ratio.

    Mirrors the kernel's float32 arithmetic: for crop > 1,
    `lo * (size - 1) + i * ((hi - lo) * (size - 1) / (crop - 1))`; for a
    single row, `0.5 * (lo + hi) * (size - 1)` computed in double.

    Returns:
        `(positions [boxes, crop], ratio)` where ratio is
        `(size - 1) / (crop - 1)` (0 when crop == 1), used by the boxes grad.
    """
    import tensorflow as tf

    size_m1 = tf.cast(size - 1, tf.float32)
    crop_m1 = tf.cast(tf.maximum(crop - 1, 1), tf.float32)
    steps = tf.cast(tf.range(crop), tf.float32)[None, :]
    scale = (hi - lo) * size_m1 / crop_m1
    spread = lo * size_m1 + steps * scale
    middle = tf.cast(
        0.5 * tf.cast(lo + hi, tf.float64) * tf.cast(size - 1, tf.float64), tf.float32
    )
    positions = tf.where(crop > 1, spread, middle + 0.0 * steps)
    ratio = tf.where(crop > 1, tf.cast(size - 1, tf.float32) / crop_m1, 0.0)
    return positions, ratio


def _geometry(
    grads: Any, boxes: Any, box_ind: Any, batch: Any, height: Any, width: Any
) -> dict[str, Any]:
    import tensorflow as tf

    shape = tf.shape(grads)
    crop_h, crop_w = shape[1], shape[2]
    y1, x1, y2, x2 = (boxes[:, i : i + 1] for i in range(4))
    in_y, height_ratio = _sample_positions(y1, y2, crop_h, height)  # [N, ch]
    in_x, width_ratio = _sample_positions(x1, x2, crop_w, width)  # [N, cw]
    valid_y = (in_y >= 0) & (in_y <= tf.cast(height - 1, tf.float32))
    valid_x = (in_x >= 0) & (in_x <= tf.cast(width - 1, tf.float32))
    valid_box = (box_ind >= 0) & (box_ind < batch)
    valid = (
        valid_box[:, None, None] & valid_y[:, :, None] & valid_x[:, None, :]
    )  # [N, ch, cw]
    # Invalid positions are clamped so index arithmetic stays in range; their
    # contributions are routed away or masked.
    safe_y = tf.where(valid_y, in_y, 0.0)
    safe_x = tf.where(valid_x, in_x, 0.0)
    top, left = tf.floor(safe_y), tf.floor(safe_x)
    return {
        "valid": valid,
        "in_y": safe_y,
        "in_x": safe_x,
        "top": tf.cast(top, tf.int32),
        "bottom": tf.cast(tf.math.ceil(safe_y), tf.int32),
        "left": tf.cast(left, tf.int32),
        "right": tf.cast(tf.math.ceil(safe_x), tf.int32),
        "y_lerp": safe_y - top,
        "x_lerp": safe_x - left,
        "box": tf.where(valid_box, box_ind, 0),
        "height_ratio": height_ratio,
        "width_ratio": width_ratio,
        "crop_h": crop_h,
        "crop_w": crop_w,
    }


def _round_half_away(values: Any) -> Any:
    """`roundf` for non-negative values (TF's round is half-to-even)."""
    import tensorflow as tf

    floor = tf.floor(values)
    return tf.cast(floor, tf.int32) + tf.cast(values - floor >= 0.5, tf.int32)


def crop_and_resize_grad_image(
    grads: Any,
    boxes: Any,
    box_ind: Any,
    image_size: Any,
    T: Any,  # noqa: N803  (the generated op's argument name)
    method: str = "bilinear",
    name: str | None = None,
) -> Any:
    """Deterministic `tf.raw_ops.CropAndResizeGradImage`.

    Args:
        grads: float32 `[num_boxes, crop_height, crop_width, depth]`.
        boxes: float32 `[num_boxes, 4]`, normalized `y1, x1, y2, x2`.
        box_ind: int32 `[num_boxes]`, the image of each box.
        image_size: int32 `[4]`: batch, height, width, depth.
        T: Output dtype (half, float32 or float64).
        method: "bilinear" or "nearest".
        name: Name scope.

    Returns:
        The image gradient, `image_size`-shaped, of dtype `T`.
    """
    import tensorflow as tf

    if isinstance(method, bytes):
        method = method.decode()
    dtype = tf.as_dtype(T)
    with tf.name_scope(name or "DeterministicCropAndResizeGradImage"):
        grads = tf.convert_to_tensor(grads, tf.float32)
        boxes = tf.convert_to_tensor(boxes, tf.float32)
        box_ind = tf.convert_to_tensor(box_ind, tf.int32)
        image_size = tf.cast(tf.convert_to_tensor(image_size), tf.int32)
        batch, height, width, depth = (image_size[i] for i in range(4))
        geo = _geometry(grads, boxes, box_ind, batch, height, width)
        base = geo["box"][:, None, None] * height * width  # [N, 1, 1]
        dump = batch * height * width  # Segment for contributions that are dropped.

        def segment(rows: Any, cols: Any) -> Any:
            flat = base + rows[:, :, None] * width + cols[:, None, :]
            return tf.where(geo["valid"], flat, dump)

        if method == "bilinear":
            y_lerp = geo["y_lerp"][:, :, None, None]
            x_lerp = geo["x_lerp"][:, None, :, None]
            dtop = (1 - y_lerp) * grads
            dbottom = y_lerp * grads
            # Kernel order per crop pixel: top-left, top-right, bottom-left,
            # bottom-right; each contribution is cast to T before adding.
            parts = tf.stack(
                [
                    (1 - x_lerp) * dtop,
                    x_lerp * dtop,
                    (1 - x_lerp) * dbottom,
                    x_lerp * dbottom,
                ],
                axis=3,
            )
            ids = tf.stack(
                [
                    segment(geo["top"], geo["left"]),
                    segment(geo["top"], geo["right"]),
                    segment(geo["bottom"], geo["left"]),
                    segment(geo["bottom"], geo["right"]),
                ],
                axis=3,
            )
        else:
            parts = grads[:, :, :, None, :]
            ids = segment(_round_half_away(geo["in_y"]), _round_half_away(geo["in_x"]))[
                ..., None
            ]
        parts = tf.reshape(tf.cast(parts, dtype), tf.stack([-1, depth]))
        summed = tf.math.unsorted_segment_sum(parts, tf.reshape(ids, [-1]), dump + 1)
        return tf.reshape(summed[:-1], tf.stack([batch, height, width, depth]))


def crop_and_resize_grad_boxes(
    grads: Any,
    image: Any,
    boxes: Any,
    box_ind: Any,
    method: str = "bilinear",
    name: str | None = None,
) -> Any:
    """Deterministic `tf.raw_ops.CropAndResizeGradBoxes` (bilinear).

    Returns:
        float32 `[num_boxes, 4]`: gradients with respect to y1, x1, y2, x2.
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicCropAndResizeGradBoxes"):
        grads = tf.convert_to_tensor(grads, tf.float32)
        image = tf.convert_to_tensor(image)
        boxes = tf.convert_to_tensor(boxes, tf.float32)
        box_ind = tf.convert_to_tensor(box_ind, tf.int32)
        shape = tf.shape(image)
        batch, height, width = shape[0], shape[1], shape[2]
        geo = _geometry(grads, boxes, box_ind, batch, height, width)
        pixels = tf.cast(image, tf.float32)
        box = tf.broadcast_to(geo["box"][:, None, None], tf.shape(geo["valid"]))

        def corner(rows: Any, cols: Any) -> Any:
            rows = tf.broadcast_to(rows[:, :, None], tf.shape(geo["valid"]))
            cols = tf.broadcast_to(cols[:, None, :], tf.shape(geo["valid"]))
            return tf.gather_nd(pixels, tf.stack([box, rows, cols], axis=-1))

        top_left = corner(geo["top"], geo["left"])
        top_right = corner(geo["top"], geo["right"])
        bottom_left = corner(geo["bottom"], geo["left"])
        bottom_right = corner(geo["bottom"], geo["right"])
        y_lerp = geo["y_lerp"][:, :, None, None]
        x_lerp = geo["x_lerp"][:, None, :, None]
        grad_y = (1 - x_lerp) * (bottom_left - top_left) + x_lerp * (
            bottom_right - top_right
        )
        grad_x = (1 - y_lerp) * (top_right - top_left) + y_lerp * (
            bottom_right - bottom_left
        )
        mask = tf.cast(geo["valid"], tf.float32)[..., None]
        grad_y = grad_y * grads * mask
        grad_x = grad_x * grads * mask
        rows = tf.cast(tf.range(geo["crop_h"]), tf.float32)[None, :, None, None]
        cols = tf.cast(tf.range(geo["crop_w"]), tf.float32)[None, None, :, None]
        dy1, dy2 = _box_gradients(
            grad_y, rows, geo["crop_h"], geo["height_ratio"], height
        )
        dx1, dx2 = _box_gradients(
            grad_x, cols, geo["crop_w"], geo["width_ratio"], width
        )
        return tf.stack(
            [tf.reduce_sum(t, axis=[1, 2, 3]) for t in (dy1, dx1, dy2, dx2)], axis=1
        )


def _box_gradients(
    grad: Any, index: Any, crop_size: Any, ratio: Any, image_size: Any
) -> tuple[Any, Any]:
    """Gradients for a box's two coordinates along one axis (y or x).

    The same arithmetic as the kernel: with a crop of one pixel the sample is
    at the box's centre, so both coordinates get half the image extent.
    """
    import tensorflow as tf

    extent = tf.cast(image_size - 1, tf.float32)
    single = tf.cast(0.5 * tf.cast(image_size - 1, tf.float64), tf.float32)
    first = tf.where(crop_size > 1, grad * (extent - index * ratio), grad * single)
    second = tf.where(crop_size > 1, grad * (index * ratio), grad * single)
    return first, second


def _gradient(op: Any, grad: Any) -> list[Any]:
    import tensorflow as tf

    image = op.inputs[0]
    if image.shape.is_fully_defined():
        image_size = image.shape.as_list()
    else:
        image_size = tf.shape(image)
    grad_image = None
    if image.dtype in (tf.float16, tf.float32, tf.float64):
        grad_image = crop_and_resize_grad_image(
            grad,
            op.inputs[1],
            op.inputs[2],
            image_size,
            T=op.get_attr("T"),
            method=op.get_attr("method"),
        )
    # TensorFlow approximates the boxes gradient with the bilinear formula
    # for both methods; so does this.
    grad_boxes = crop_and_resize_grad_boxes(grad, image, op.inputs[1], op.inputs[2])
    return [grad_image, grad_boxes, None, None]


def _apply(swap: Swap) -> None:
    import tensorflow.python.ops.image_grad  # noqa: F401  (registers the original)

    swap.gradient("CropAndResize", _gradient)


PATCH = Patch(
    replaces=("CropAndResizeGradImage", "CropAndResizeGradBoxes"),
    summary="CropAndResizeGradImage/Boxes -> bilinear weights + UnsortedSegmentSum / Sum",
    upstream="https://github.com/tensorflow/tensorflow/issues/42033",
    apply=_apply,
)
