"""What the product and convolution patches share: shapes, refusals, one product.

`pool_size_free_products` composes MatMul, BatchMatMul and the convolutions'
gradients out of oneDNN 1x1 convolutions; `fixed_order_products` and
`fixed_order_convolutions` compute those ops by tfdet's kernel and fall back
to the same compositions where it cannot. Both kinds must agree on which
inputs TensorFlow's op keeps (a dtype, an empty dimension, a grouped
convolution, a filter shape unknown when traced, `Conv2DBackpropInput`'s two
input sizes) and compute a BatchMatMul's broadcast batches the same way, or
one op would give other bits under one patch than under the other; those
decisions, and the grouped 1x1-convolution product itself, are written here
once.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdet._kernels.library import tracing_for_xla
from tfdet._patching import _exact_math

# Rows of a product per image of the convolution. oneDNN splits the work of
# a 1x1 convolution over images and output-channel blocks, so each image is
# computed whole by one thread, the same way for every pool size. One row
# per image makes each image a vector-matrix product that reads the whole
# filter again; 8 rows reuse it, at about half that cost (`benchmarks/
# patch_cost.py`), with bits as free of the pool size. One image of all the
# rows follows the pool size: oneDNN then splits the image.
_ROWS_PER_IMAGE = 8


def tensorflows_under_xla(op: _exact_math.GeneratedOp) -> Any:
    """A composition that XLA may not compile (shapes it computes at run
    time: XLA wants them constant) becomes, while XLA traces, TensorFlow's
    own op, which XLA compiles to bits of its own (the tiers of a run under
    XLA leave the batch out already)."""

    def decorate(function: Any) -> Any:
        @functools.wraps(function)
        def composed_unless_xla(*args: Any, **kwargs: Any) -> Any:
            if tracing_for_xla():
                return op.original(*args, **kwargs)
            return function(*args, **kwargs)

        return composed_unless_xla

    return decorate


def batch_product(a: Any, b: Any) -> Any:
    """`a @ b` for (batch, m, k) and (batch, k, n): a grouped 1x1 convolution.

    The images are the m rows, `_ROWS_PER_IMAGE` pixels each (zero rows pad
    the last one), each pixel with the batch's k-channel groups side by side;
    group g of the convolution multiplies `a[g]` by `b[g]`. oneDNN sums each
    output's k channels inside one thread.
    """
    import tensorflow as tf

    groups, rows, inner = tf.shape(a)[0], tf.shape(a)[1], tf.shape(a)[2]
    columns = tf.shape(b)[2]
    pixels = tf.transpose(a, [1, 0, 2])
    # Zeros by concatenation, not tf.pad: oneDNN fuses a Pad into the
    # convolution that reads it.
    padding = (-rows) % _ROWS_PER_IMAGE
    pixels = tf.concat([pixels, tf.zeros(tf.stack([padding, groups, inner]))], 0)
    images = tf.reshape(pixels, tf.stack([-1, 1, _ROWS_PER_IMAGE, groups * inner]))
    kernel = tf.reshape(tf.transpose(b, [1, 0, 2]), tf.stack([1, 1, inner, -1]))
    product = tf.nn.conv2d(images, kernel, strides=1, padding="VALID")
    product = tf.reshape(product, tf.stack([-1, groups, columns]))[:rows]
    return tf.transpose(product, [1, 0, 2])


def batch_matmul(a: Any, b: Any) -> Any:
    """`batch_product(a, b)`, its gradients the same kind of product."""
    import tensorflow as tf

    swap = tf.linalg.matrix_transpose

    @tf.custom_gradient
    def run(a: Any, b: Any) -> Any:
        def gradient(upstream: Any) -> tuple[Any, Any]:
            return (
                batch_product(upstream, swap(b)),
                batch_product(swap(a), upstream),
            )

        return batch_product(a, b), gradient

    return run(a, b)


def broadcast_batch_matmul(a: Any, b: Any, adj_x: bool, adj_y: bool) -> Any:
    """A `BatchMatMul` of `a` and `b` by `batch_matmul`, over one batch axis.

    `pool_size_free_products` computes every BatchMatMul so, and
    `fixed_order_products` where its kernel did not load: one composition,
    so one op's bits are the same under either. Its static shape is the
    caller's to set (each patch knows other dimensions of it).
    """
    import tensorflow as tf

    # Batch shapes broadcast as TensorFlow's op does them, known or not
    # when traced (a Keras step's batch is not): falling back to the
    # original op for an unknown batch would give other bits than the same
    # product traced with a known one.
    batch = tf.broadcast_dynamic_shape(tf.shape(a)[:-2], tf.shape(b)[:-2])
    # BroadcastTo hands its input on when the shape is already that.
    a = tf.broadcast_to(a, tf.concat([batch, tf.shape(a)[-2:]], 0))
    b = tf.broadcast_to(b, tf.concat([batch, tf.shape(b)[-2:]], 0))
    a = tf.reshape(a, tf.concat([[-1], tf.shape(a)[-2:]], 0))
    b = tf.reshape(b, tf.concat([[-1], tf.shape(b)[-2:]], 0))
    if adj_x:
        a = tf.linalg.matrix_transpose(a)
    if adj_y:
        b = tf.linalg.matrix_transpose(b)
    product = batch_matmul(a, b)
    return tf.reshape(product, tf.concat([batch, tf.shape(product)[1:]], 0))


def has_no_elements(*shapes: Any) -> bool:
    """Whether a dimension of the product's matrices is statically 0.

    oneDNN refuses a convolution whose filter has no elements; TensorFlow's
    products return the empty or zero result, so those go to the original.
    """
    return any(dimension == 0 for shape in shapes for dimension in shape)


def mat_mul_left_to_tensorflow(a: Any, b: Any) -> bool:
    """Whether a `MatMul` of tensors `a` and `b` stays TensorFlow's own op.

    The product patches (`pool_size_free_products` and
    `fixed_order_products`) compute float32 products with no statically
    empty dimension.
    """
    import tensorflow as tf

    return (
        a.dtype != tf.float32
        or b.dtype != tf.float32
        or has_no_elements(a.shape, b.shape)
    )


def batch_mat_mul_left_to_tensorflow(
    a: Any, b: Any, out_type: Any
) -> tuple[bool, str | None]:
    """Whether a `BatchMatMul` of tensors `a` and `b` stays TensorFlow's op.

    The product patches compute float32 products of rank 2 and more with
    no statically empty matrix dimension.

    Returns:
        Whether it stays, and the reason its notice names where the dtype
        does not say it (an unknown rank).
    """
    import tensorflow as tf

    unknown = a.shape.rank is None or b.shape.rank is None
    left = (
        unknown
        or a.dtype != tf.float32
        or b.dtype != tf.float32
        or tf.as_dtype(out_type) != tf.float32
        or min(a.shape.rank, b.shape.rank) < 2
        or has_no_elements(a.shape[-2:], b.shape[-2:])
    )
    return left, "an unknown rank" if unknown else None


def static_filter_shape(filter_sizes: Any) -> tuple[int, ...] | None:
    """The filter's shape as numbers, or None when it is not known statically."""
    shape = _exact_math.static_shape(filter_sizes)
    return tuple(shape.as_list()) if shape.is_fully_defined() else None


def filter_shape(kernel: Any) -> tuple[int, ...] | None:
    """A filter tensor's shape as numbers, or None when it is not known when
    traced (`static_filter_shape` reads it from a gradient's `filter_sizes`)."""
    return tuple(kernel.shape.as_list()) if kernel.shape.is_fully_defined() else None


def ungrouped(channels: Any, shape: tuple[int, ...] | None) -> bool:
    """Whether the filter's `shape` (HWIO) is known and has the image's
    `channels` (None where unknown): a grouped convolution's filter has fewer."""
    return shape is not None and channels is not None and shape[2] == channels


def convolution_unsupported(data_format: str, is_ungrouped: bool) -> str | None:
    """What a convolution's gradient replacement cannot take, or None.

    Args:
        data_format: The convolution's; only NHWC is computed here.
        is_ungrouped: Whether the filter's shape is known and has x's
            channels (`ungrouped`).
    """
    if data_format != "NHWC":
        return data_format
    if not is_ungrouped:
        return "a grouped convolution or an unknown filter shape"
    return None


def four_input_sizes(
    input_sizes: Any, kernel: Any, upstream: Any, data_format: str
) -> Any:
    """`Conv2DBackpropInput`'s `input_sizes` as its 4 sizes, or None.

    TensorFlow's op also takes the 2 spatial sizes alone, `[height, width]`:
    the batch is then the output gradient's, the channels the filter's
    third dimension (`Conv2DBackpropComputeInputShape`). The kernel and
    the composition want all 4, as a list where they are known when traced
    (their static shape chooses the path), else as a tensor.

    Returns:
        The 4 sizes, or None where TensorFlow's op must take `input_sizes`
        as they are: a count not known when traced or neither 4 nor 2, or 2
        beside a filter or output gradient not of rank 4 (its error).
    """
    import tensorflow as tf

    if isinstance(input_sizes, (list, tuple)):
        count: int | None = len(input_sizes)
    else:
        shape = tf.convert_to_tensor(input_sizes).shape
        count = shape[0] if shape.rank == 1 else None
    if count == 4:
        return input_sizes
    if count != 2 or kernel.shape.rank != 4 or upstream.shape.rank != 4:
        return None
    static = tf.get_static_value(tf.convert_to_tensor(input_sizes))
    if static is not None:
        height, width = (int(size) for size in static)
    else:
        spatial = tf.cast(input_sizes, tf.int32)
        height, width = spatial[0], spatial[1]
    batch = upstream.shape[0]
    batch = tf.shape(upstream)[0] if batch is None else batch
    channels = kernel.shape[2]
    channels = tf.shape(kernel)[2] if channels is None else channels
    if data_format == "NCHW":
        sizes = [batch, channels, height, width]
    else:
        sizes = [batch, height, width, channels]
    if all(isinstance(size, int) for size in sizes):
        return sizes
    return tf.stack([tf.cast(size, tf.int32) for size in sizes])
