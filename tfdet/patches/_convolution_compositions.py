"""Convolutions and BiasAddGrad as `pool_size_free_products` computes them.

`Conv2D`, its filter and input gradients, the depthwise filter gradient
and `BiasAddGrad`. oneDNN's forward convolution splits its work over
outputs only, so each gradient is written as forward convolutions or
products (`_geometry.batch_product`) of the image's patches, and sums as
reductions that split only over the channels; `Conv2D` itself is
TensorFlow's, never on a batch of one image. The patch module binds these
replacements (`pool_size_free_products._apply`), and
`fixed_order_convolutions` calls them for what its kernel cannot take;
which convolutions they refuse is `_geometry`'s, which that patch shares.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching import _exact_math
from tfdet.patches import _geometry, _whole_packets

CONV = _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", "conv2d")
FILTER_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "conv2d_backprop_filter"
)
INPUT_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "conv2d_backprop_input"
)
DEPTHWISE_FILTER_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "depthwise_conv2d_native_backprop_filter"
)
BIAS_GRAD = _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", "bias_add_grad")


def _same_padding(size: Any, kernel: int, stride: int, dilation: int) -> Any:
    """`(before, after)` padding of one spatial axis under "SAME"."""
    import tensorflow as tf

    reach = (kernel - 1) * dilation + 1
    out = (size + stride - 1) // stride
    total = tf.maximum((out - 1) * stride + reach - size, 0)
    return tf.stack([total // 2, total - total // 2])


def _image_patches(
    x: Any, out_shape: Any, kernel: tuple[int, int], strides: Any, dilations: Any
) -> Any:
    """`tf.image.extract_patches` of a padded NHWC `x`, as strided slices.

    One slice per filter position, concatenated over channels in the
    filter's (row, column) order: a copy of each value, where TensorFlow's
    `ExtractImagePatches` took 20 ms for a (64, 32, 32, 3) input and a 3x3
    filter (AMD EPYC Zen 4).
    """
    import tensorflow as tf

    return tf.concat(
        [
            _window(x, out_shape, (row, column), strides, dilations)
            for row in range(kernel[0])
            for column in range(kernel[1])
        ],
        axis=-1,
    )


def _window(
    x: Any, out_shape: Any, position: tuple[int, int], strides: Any, dilations: Any
) -> Any:
    """The values of a padded NHWC `x` that the filter's `position` (row,
    column) meets at each output position: a strided slice."""
    top, left = position[0] * dilations[1], position[1] * dilations[2]
    return x[
        :,
        top : top + (out_shape[1] - 1) * strides[1] + 1 : strides[1],
        left : left + (out_shape[2] - 1) * strides[2] + 1 : strides[2],
        :,
    ]


def _padded(
    x: Any,
    padding: str,
    explicit_paddings: Any,
    kernel: tuple[int, int],
    strides: Any,
    dilations: Any,
) -> Any:
    """NHWC `x` with the rows and columns a convolution's `padding` adds."""
    import tensorflow as tf

    if padding == "SAME":
        shape = tf.shape(x)
        return tf.pad(
            x,
            tf.stack(
                [
                    tf.zeros(2, tf.int32),
                    _same_padding(shape[1], kernel[0], strides[1], dilations[1]),
                    _same_padding(shape[2], kernel[1], strides[2], dilations[2]),
                    tf.zeros(2, tf.int32),
                ]
            ),
        )
    if padding == "EXPLICIT":
        return tf.pad(x, [list(explicit_paddings[i : i + 2]) for i in range(0, 8, 2)])
    return x


@_geometry.tensorflows_under_xla(FILTER_GRAD)
def conv2d_backprop_filter(
    input: Any,  # noqa: A002 - TensorFlow's argument name
    filter_sizes: Any,
    out_backprop: Any,
    strides: Any,
    padding: str,
    use_cudnn_on_gpu: bool = True,
    explicit_paddings: Any = (),
    data_format: str = "NHWC",
    dilations: Any = (1, 1, 1, 1),
    name: str | None = None,
) -> Any:
    """`tf.raw_ops.Conv2DBackpropFilter`, bits independent of the pool size."""
    import tensorflow as tf

    x = tf.convert_to_tensor(input)
    sizes = _geometry.static_filter_shape(filter_sizes)
    data_format, padding = (
        _exact_math.attribute_text(data_format, "NHWC"),
        _exact_math.attribute_text(padding, "VALID"),
    )
    # A grouped convolution's filter has fewer channels than x.
    unsupported = _geometry.convolution_unsupported(
        data_format, _geometry.ungrouped(x.shape[-1], sizes)
    )
    if x.dtype != tf.float32 or unsupported is not None:
        _whole_packets.left_to_tensorflow("Conv2DBackpropFilter", x.dtype, unsupported)
        return _exact_math.call_convolution(
            FILTER_GRAD.original,
            (input, filter_sizes, out_backprop),
            strides,
            padding,
            use_cudnn_on_gpu,
            explicit_paddings,
            data_format,
            dilations,
            name,
        )
    # sizes is None only where `unsupported` says so, returned above.
    height, width, channels, filters = (int(s) for s in sizes)  # type: ignore[union-attr]
    with tf.name_scope(name or "PoolSizeFreeConv2DBackpropFilter"):
        x = _padded(x, padding, explicit_paddings, (height, width), strides, dilations)
        patches = _image_patches(
            x, tf.shape(out_backprop), (height, width), strides, dilations
        )
        # Each patch is flattened as (row, column, channel), the filter's order.
        patches = tf.reshape(patches, [-1, height * width * channels])
        upstream = tf.reshape(out_backprop, [-1, filters])
        transposed = tf.transpose(patches)[None]
        gradient = _geometry.batch_product(transposed, upstream[None])[0]
        return tf.reshape(gradient, [height, width, channels, filters])


@_geometry.tensorflows_under_xla(DEPTHWISE_FILTER_GRAD)
def depthwise_conv2d_native_backprop_filter(
    input: Any,  # noqa: A002 - TensorFlow's argument name
    filter_sizes: Any,
    out_backprop: Any,
    strides: Any,
    padding: str,
    explicit_paddings: Any = (),
    data_format: str = "NHWC",
    dilations: Any = (1, 1, 1, 1),
    name: str | None = None,
) -> Any:
    """`tf.raw_ops.DepthwiseConv2dNativeBackpropFilter`, bits independent of
    the pool size.

    TensorFlow's kernel gives each thread a share of the images and adds the
    threads' partial sums; here each filter position's gradient is a `Sum`
    over images and positions of the input's slice times the output
    gradient, a reduction that splits only over its outputs (the channels),
    as `bias_add_grad`'s. One slice at a time, so that no tensor is larger
    than the output gradient.
    """
    import tensorflow as tf

    x = tf.convert_to_tensor(input)
    sizes = _geometry.static_filter_shape(filter_sizes)
    data_format, padding = (
        _exact_math.attribute_text(data_format, "NHWC"),
        _exact_math.attribute_text(padding, "VALID"),
    )
    unsupported = None
    if data_format != "NHWC":
        unsupported = data_format
    elif sizes is None:
        unsupported = "an unknown filter shape"
    if x.dtype != tf.float32 or unsupported is not None:
        _whole_packets.left_to_tensorflow(
            "DepthwiseConv2dNativeBackpropFilter", x.dtype, unsupported
        )
        return DEPTHWISE_FILTER_GRAD.original(
            input,
            filter_sizes,
            out_backprop,
            strides,
            padding,
            explicit_paddings=list(explicit_paddings),
            data_format=data_format,
            dilations=list(dilations),
            name=name,
        )
    # sizes is None only where `unsupported` says so, returned above.
    height, width, channels, multiplier = (int(s) for s in sizes)  # type: ignore[union-attr]
    with tf.name_scope(name or "PoolSizeFreeDepthwiseConv2dNativeBackpropFilter"):
        x = _padded(x, padding, explicit_paddings, (height, width), strides, dilations)
        out_shape = tf.shape(out_backprop)
        # Output channel c * multiplier + m comes from input channel c.
        upstream = tf.reshape(
            out_backprop, tf.concat([out_shape[:3], [channels, multiplier]], 0)
        )
        taps = [
            tf.reduce_sum(
                _window(x, out_shape, (row, column), strides, dilations)[..., None]
                * upstream,
                axis=[0, 1, 2],
            )
            for row in range(height)
            for column in range(width)
        ]
        return tf.reshape(tf.stack(taps), [height, width, channels, multiplier])


def _conv(
    x: Any,
    kernel: Any,
    strides: Any,
    padding: Any,
    explicit_paddings: Any = (),
    dilations: Any = (1, 1, 1, 1),
) -> Any:
    """TensorFlow's NHWC float32 `Conv2D`, never on a batch of one image.

    oneDNN computes a batch of one with another kernel than larger batches
    (other bits for the one image; which kernel it takes also follows the
    pool size), so one image is computed beside a zero image and the pair's
    first output kept. From two images on, the kernel and each output's
    summation order do not follow the batch size.
    """
    import tensorflow as tf

    def convolve(images: Any) -> Any:
        return CONV.original(
            images,
            kernel,
            strides=strides,
            padding=padding,
            explicit_paddings=list(explicit_paddings),
            data_format="NHWC",
            dilations=list(dilations),
        )

    def paired(images: Any) -> Any:
        return convolve(tf.concat([images, tf.zeros_like(images)], 0))[:1]

    if x.shape[0] is not None:
        return paired(x) if x.shape[0] == 1 else convolve(x)
    # tf.equal: under tf.compat.v1 graphs, `==` compares the tensors themselves.
    one_image = tf.equal(tf.shape(x)[0], 1)
    return tf.cond(one_image, lambda: paired(x), lambda: convolve(x))


@_geometry.tensorflows_under_xla(CONV)
def conv2d(
    input: Any,  # noqa: A002 - TensorFlow's argument name
    filter: Any,  # noqa: A002 - TensorFlow's argument name
    strides: Any,
    padding: str,
    use_cudnn_on_gpu: bool = True,
    explicit_paddings: Any = (),
    data_format: str = "NHWC",
    dilations: Any = (1, 1, 1, 1),
    name: str | None = None,
) -> Any:
    """`tf.raw_ops.Conv2D`, each image's bits independent of the batch size."""
    import tensorflow as tf

    x = tf.convert_to_tensor(input)
    data_format, padding = (
        _exact_math.attribute_text(data_format, "NHWC"),
        _exact_math.attribute_text(padding, "VALID"),
    )
    if x.dtype != tf.float32 or data_format != "NHWC" or x.shape.rank != 4:
        _whole_packets.left_to_tensorflow(
            "Conv2D", x.dtype, None if data_format == "NHWC" else data_format
        )
        return _exact_math.call_convolution(
            CONV.original,
            (input, filter),
            strides,
            padding,
            use_cudnn_on_gpu,
            explicit_paddings,
            data_format,
            dilations,
            name,
        )
    with tf.name_scope(name or "PoolSizeFreeConv2D"):
        return _conv(x, filter, strides, padding, explicit_paddings, dilations)


def _dilate(gradient: Any, axis: int, stride: int) -> Any:
    """`stride - 1` zeros between neighbours along `axis` (1 or 2) of NHWC."""
    import tensorflow as tf

    if stride == 1:
        return gradient
    spread = tf.expand_dims(gradient, axis + 1)
    # Padded rather than concatenated with zeros of a computed shape: the
    # same values, and paddings XLA can compile (it needs them constant).
    paddings = [[0, 0]] * 5
    paddings[axis + 1] = [0, stride - 1]
    spread = tf.pad(spread, paddings)
    shape = tf.shape(gradient)
    merged = tf.tensor_scatter_nd_update(shape, [[axis]], [shape[axis] * stride])
    spread = tf.reshape(spread, merged)
    # The zeros after the last row (or column) reach past the input.
    keep = (shape[axis] - 1) * stride + 1
    return spread[:, :keep] if axis == 1 else spread[:, :, :keep]


@_geometry.tensorflows_under_xla(INPUT_GRAD)
def conv2d_backprop_input(
    input_sizes: Any,
    filter: Any,  # noqa: A002 - TensorFlow's argument name
    out_backprop: Any,
    strides: Any,
    padding: str,
    use_cudnn_on_gpu: bool = True,
    explicit_paddings: Any = (),
    data_format: str = "NHWC",
    dilations: Any = (1, 1, 1, 1),
    name: str | None = None,
) -> Any:
    """`tf.raw_ops.Conv2DBackpropInput` as a forward convolution.

    oneDNN's backward-by-data splits a strided convolution's work by the
    pool size (a 24x24, 24 -> 48 channel, stride-2 layer: other bits with 3
    and 6 threads than with 1, 2, 4, 8), where its forward convolution splits
    only over outputs. The input gradient is the convolution of the output
    gradient, `stride - 1` zeros between its values and padded by the
    filter's reach, with the filter reversed in space and its channels
    swapped.
    """
    import tensorflow as tf

    kernel = tf.convert_to_tensor(filter)
    upstream = tf.convert_to_tensor(out_backprop)
    data_format, padding = (
        _exact_math.attribute_text(data_format, "NHWC"),
        _exact_math.attribute_text(padding, "VALID"),
    )
    four = _geometry.four_input_sizes(input_sizes, kernel, upstream, data_format)
    # A grouped convolution's filter has fewer channels than x.
    unsupported = (
        "input sizes that are not 4 or 2 numbers"
        if four is None
        else _geometry.convolution_unsupported(
            data_format,
            _geometry.ungrouped(
                _exact_math.static_shape(four)[3], _geometry.filter_shape(kernel)
            ),
        )
    )
    if upstream.dtype != tf.float32 or unsupported is not None:
        _whole_packets.left_to_tensorflow(
            "Conv2DBackpropInput", upstream.dtype, unsupported
        )
        return _exact_math.call_convolution(
            INPUT_GRAD.original,
            (input_sizes, filter, out_backprop),
            strides,
            padding,
            use_cudnn_on_gpu,
            explicit_paddings,
            data_format,
            dilations,
            name,
        )
    sizes = tf.cast(four, tf.int32)
    height, width = kernel.shape[0], kernel.shape[1]
    with tf.name_scope(name or "PoolSizeFreeConv2DBackpropInput"):
        spread = upstream
        for axis, size in ((1, height), (2, width)):
            stride, dilation = int(strides[axis]), int(dilations[axis])
            reach = (size - 1) * dilation + 1
            if padding == "SAME":
                before = _same_padding(sizes[axis], size, stride, dilation)[0]
            elif padding == "EXPLICIT":
                before = int(explicit_paddings[2 * axis])
            else:
                before = 0
            spread = _dilate(spread, axis, stride)
            # The padded gradient spans the input plus the reach less one:
            # `reach - 1 - before` in front, the rest behind. A forward pad
            # wider than the reach makes a side negative: rows that only
            # padding saw, cut off.
            length = tf.shape(spread)[axis]
            front = reach - 1 - before
            back = sizes[axis] + before - length
            spread = _cut_and_pad(spread, axis, front, back, length)
        # The reshapes and pads above lose the static channel count: traced
        # with an unknown batch (a Keras step, `predict` at a new batch
        # size), the gradients of the convolution below would take it for a
        # grouped one and leave it to TensorFlow's ops, which follow the
        # pool size.
        spread.set_shape([None, None, None, upstream.shape[3]])
        flipped = tf.transpose(tf.reverse(kernel, [0, 1]), [0, 1, 3, 2])
        return _conv(spread, flipped, [1, 1, 1, 1], "VALID", (), dilations)


def _cut_and_pad(tensor: Any, axis: int, front: Any, back: Any, length: Any) -> Any:
    """`tensor` padded by zeros along `axis` (1 or 2), or cut where negative."""
    import tensorflow as tf

    start = tf.maximum(-front, 0)
    stop = length - tf.maximum(-back, 0)
    kept = tensor[:, start:stop] if axis == 1 else tensor[:, :, start:stop]
    pads = [[0, 0]] * 4
    pads[axis] = tf.stack([tf.maximum(front, 0), tf.maximum(back, 0)])
    return tf.pad(kept, tf.stack(pads))


def bias_add_grad(
    out_backprop: Any, data_format: str = "NHWC", name: str | None = None
) -> Any:
    """`tf.raw_ops.BiasAddGrad` as a `Sum` that splits only over the channels."""
    import tensorflow as tf

    upstream = tf.convert_to_tensor(out_backprop)
    rank = upstream.shape.rank
    if rank is None or upstream.dtype != tf.float32:
        _whole_packets.left_to_tensorflow(
            "BiasAddGrad", upstream.dtype, "an unknown rank" if rank is None else None
        )
        return BIAS_GRAD.original(out_backprop, data_format=data_format, name=name)
    data_format = _exact_math.attribute_text(data_format, "NHWC")
    channel = 1 if data_format.startswith("NC") and rank > 2 else rank - 1
    axes = [axis for axis in range(rank) if axis != channel]
    with tf.name_scope(name or "PoolSizeFreeBiasAddGrad"):
        return tf.reduce_sum(upstream, axis=axes)
