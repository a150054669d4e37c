"""2-D convolutions by tfdet's own kernel, bits fixed by the shapes alone.

`Conv2D`, `Conv2DBackpropInput` and `Conv2DBackpropFilter` of NHWC float32
(Keras's Conv1D and Conv2D, their gradients, Conv2DTranspose's forward)
are computed by tfdet's fixed-order product kernel
(`tfdet/_kernels/fixed_order.py`) as products over the image's
patches, read from the image itself: every output element (an output
pixel's filter, an input pixel's channel, a weight) is one chain of fused
multiply-adds over its terms in an order fixed by the shapes (a long sum in
K blocks fixed by its length), and the work is split over output tiles and
those blocks. So a convolution's bits follow neither the
pool size, nor the batch (an image's output and input gradient are the
same computed alone), nor the vector width, nor whether oneDNN is on:
where `pool_size_free_products` relies on oneDNN's forward convolution
(off on aarch64 and wherever TensorFlow leaves it off), this does not.

Slower than oneDNN's own convolutions on an AMD EPYC Zen 3 (AVX2, 2 threads,
the built-in CNN's layers, batch 64: forward 1.1-1.7x, input gradient
1.4-2.4x, filter gradient 0.9-1.3x, 3.6x on 3 channels;
`benchmarks/fixed_order_convolutions.py`); on a 2-core AMD EPYC Zen 4
(AVX-512, batch 32, the kernel reading the image in place), the same
layers' forward 1.14x, input gradient 1.44x, filter gradient 1.19x in
sum (`benchmarks/step_time_ab.py --convolutions cnn`); whole models run at plain
TensorFlow's speed all the same (docs/how-to/cost.md), so "auto" installs
it, with `pool_size_free_products` and `fixed_order_products`. Installed with
`pool_size_free_products`, that patch leaves the convolutions to this one;
what the kernel cannot take (another dtype or layout, a grouped convolution,
channels unknown when traced) goes to that patch's composition, which
leaves what it cannot take to TensorFlow, saying so once. Where the kernel
is neither installed with tfdet, cached nor buildable (no C++ compiler),
tfdet says so once, the
composition computes every convolution (other bits), and the profile's
`kernels` leaves this patch out. Values agree with TensorFlow's to float32
rounding. A convolution with a dimension of 0, or a rank TensorFlow
refuses, known when traced, is TensorFlow's own op (its empty or zero
result, its error); `Conv2DBackpropInput` takes `[height, width]` input
sizes as TensorFlow's does (`ci/tf_op_tests.py` runs TensorFlow's own
tests). Exports trace the composition instead (`export_without_kernels`),
so a SavedModel loads without tfdet. A depthwise convolution's filter gradient (one filter per
channel) is the kernel's too: each weight one chain over the output
positions in order, the channels in the vectors' lanes. Not covered: the
depthwise forward and input gradient (TensorFlow's split only over their
outputs), a depth multiplier above one (the composition) and 3-D
convolutions.
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels import fixed_order
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch
from tfdet.patches import _convolution_compositions, _geometry

_CONVOLUTIONS = {
    name: _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", name)
    for name in (
        "conv2d",
        "conv2d_backprop_input",
        "conv2d_backprop_filter",
        "depthwise_conv2d_native_backprop_filter",
    )
}


def _channels(x: Any) -> Any:
    """An NHWC image's channels, or None where its rank is not 4 when traced."""
    return x.shape[3] if x.shape.rank == 4 else None


def _kernel_takes(data_format: Any, tensors: Any, ungrouped: bool) -> bool:
    """Whether the kernel computes this convolution (else the composition does).

    It takes NHWC float32 whose filter (HWIO) is known when traced and has
    the image's channels (`ungrouped`), and only where the kernel loaded:
    what `pool_size_free_products` computes itself, the same way.
    """
    import tensorflow as tf

    unsupported = _geometry.convolution_unsupported(
        _exact_math.attribute_text(data_format, "NHWC"), ungrouped
    )
    return (
        unsupported is None
        and all(tensor.dtype == tf.float32 for tensor in tensors)
        and fixed_order.load() is not None
    )


def _attributes(
    strides: Any, padding: Any, explicit_paddings: Any, dilations: Any
) -> dict[str, Any]:
    return {
        "strides": strides,
        "padding": _exact_math.attribute_text(padding, "VALID"),
        "explicit_paddings": explicit_paddings,
        "dilations": dilations,
    }


def _for_tensorflow(images: tuple[Any, ...], filters: tuple[Any, ...]) -> bool:
    """Whether TensorFlow's own op (`GeneratedOp.tensorflows`) takes a
    convolution, by its operands' shapes known when traced: `images` (NHWC
    input and output gradient, `tf.TensorShape`s) and `filters` (the
    filter's, or the 4 sizes one names).

    A rank TensorFlow refuses (an image below 4, a filter other than 4):
    its op raises its own error, where the kernel's (or an IndexError
    here) would be another. A dimension of 0: its op gives the empty
    result, or zeros where only the terms are empty (an output gradient
    with no columns), which have no order to fix; the kernel refused some.
    """

    def refused(shape: Any, ranks: range) -> bool:
        return shape.rank is not None and (
            shape.rank not in ranks or any(size == 0 for size in shape)
        )

    return any(refused(shape, range(4, 99)) for shape in images) or any(
        refused(shape, range(4, 5)) for shape in filters
    )


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
    """`tf.raw_ops.Conv2D` by the fixed-order kernel (NHWC float32)."""
    import tensorflow as tf

    x, kernel = tf.convert_to_tensor(input), tf.convert_to_tensor(filter)
    if _for_tensorflow((x.shape,), (kernel.shape,)):
        return _exact_math.call_convolution(
            _CONVOLUTIONS["conv2d"].tensorflows, (input, filter), strides,
            padding, use_cudnn_on_gpu, explicit_paddings, data_format,
            dilations, name,
        )  # fmt: skip
    ungrouped = _geometry.ungrouped(_channels(x), _geometry.filter_shape(kernel))
    if not _kernel_takes(data_format, (x, kernel), ungrouped):
        return _convolution_compositions.conv2d(
            input, filter, strides, padding, use_cudnn_on_gpu,
            explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    with tf.name_scope(name or "FixedOrderConv2D"):
        return fixed_order.conv2d(
            x, kernel, **_attributes(strides, padding, explicit_paddings, dilations)
        )


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
    """`tf.raw_ops.Conv2DBackpropInput` by the fixed-order kernel (NHWC float32)."""
    import tensorflow as tf

    kernel, upstream = tf.convert_to_tensor(filter), tf.convert_to_tensor(out_backprop)
    # TensorFlow's op also takes [height, width] (the batch and channels
    # then from the other operands); the kernel wants all 4.
    four = _geometry.four_input_sizes(
        input_sizes, kernel, upstream, _exact_math.attribute_text(data_format, "NHWC")
    )
    if four is None or _for_tensorflow(
        (upstream.shape, _exact_math.static_shape(four)), (kernel.shape,)
    ):
        return _exact_math.call_convolution(
            _CONVOLUTIONS["conv2d_backprop_input"].tensorflows,
            (input_sizes, filter, out_backprop), strides, padding,
            use_cudnn_on_gpu, explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    input_sizes = four
    ungrouped = _geometry.ungrouped(
        _exact_math.static_shape(input_sizes)[3],
        _geometry.filter_shape(kernel),
    )
    if not _kernel_takes(data_format, (kernel, upstream), ungrouped):
        return _convolution_compositions.conv2d_backprop_input(
            input_sizes, filter, out_backprop, strides, padding, use_cudnn_on_gpu,
            explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    with tf.name_scope(name or "FixedOrderConv2DBackpropInput"):
        return fixed_order.conv2d_backprop_input(
            tf.cast(input_sizes, tf.int32),
            kernel,
            upstream,
            **_attributes(strides, padding, explicit_paddings, dilations),
        )


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
    """`tf.raw_ops.Conv2DBackpropFilter` by the fixed-order kernel (NHWC float32)."""
    import tensorflow as tf

    x, upstream = tf.convert_to_tensor(input), tf.convert_to_tensor(out_backprop)
    if _for_tensorflow(
        (x.shape, upstream.shape), (_exact_math.static_shape(filter_sizes),)
    ):
        return _exact_math.call_convolution(
            _CONVOLUTIONS["conv2d_backprop_filter"].tensorflows,
            (input, filter_sizes, out_backprop), strides, padding,
            use_cudnn_on_gpu, explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    sizes = _geometry.static_filter_shape(filter_sizes)
    ungrouped = _geometry.ungrouped(_channels(x), sizes)
    if not _kernel_takes(data_format, (x, upstream), ungrouped):
        return _convolution_compositions.conv2d_backprop_filter(
            input, filter_sizes, out_backprop, strides, padding, use_cudnn_on_gpu,
            explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    with tf.name_scope(name or "FixedOrderConv2DBackpropFilter"):
        return fixed_order.conv2d_backprop_filter(
            x,
            tf.cast(filter_sizes, tf.int32),
            upstream,
            **_attributes(strides, padding, explicit_paddings, dilations),
        )


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
    """`tf.raw_ops.DepthwiseConv2dNativeBackpropFilter` by the fixed-order
    kernel (NHWC float32, one filter per channel; a depth multiplier above
    one goes to `pool_size_free_products`' composition)."""
    import tensorflow as tf

    x, upstream = tf.convert_to_tensor(input), tf.convert_to_tensor(out_backprop)
    if _for_tensorflow(
        (x.shape, upstream.shape), (_exact_math.static_shape(filter_sizes),)
    ):
        # TensorFlow's own op (see `_for_tensorflow`); it has no
        # `use_cudnn_on_gpu`.
        return _CONVOLUTIONS["depthwise_conv2d_native_backprop_filter"].tensorflows(
            input, filter_sizes, out_backprop, strides, padding,
            explicit_paddings=list(explicit_paddings), data_format=data_format,
            dilations=list(dilations), name=name,
        )  # fmt: skip
    sizes = _geometry.static_filter_shape(filter_sizes)
    one_per_channel = sizes is not None and sizes[3] == 1
    if not _kernel_takes(data_format, (x, upstream), one_per_channel):
        return _convolution_compositions.depthwise_conv2d_native_backprop_filter(
            input, filter_sizes, out_backprop, strides, padding,
            explicit_paddings, data_format, dilations, name,
        )  # fmt: skip
    with tf.name_scope(name or "FixedOrderDepthwiseConv2dNativeBackpropFilter"):
        return fixed_order.depthwise_conv2d_backprop_filter(
            x,
            tf.cast(filter_sizes, tf.int32),
            upstream,
            **_attributes(strides, padding, explicit_paddings, dilations),
        )


# The op types this patch computes apart from the pool size and the batch.
COVERED = (
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "DepthwiseConv2dNativeBackpropFilter",
)


def _apply(swap: Any) -> None:
    # Built (or found in the cache) now, so the first convolution does not
    # pay for the compiler, and a missing compiler is said at enable().
    fixed_order.load()
    _CONVOLUTIONS["conv2d"].replace(swap, conv2d)
    _CONVOLUTIONS["conv2d_backprop_input"].replace(swap, conv2d_backprop_input)
    _CONVOLUTIONS["conv2d_backprop_filter"].replace(swap, conv2d_backprop_filter)
    _CONVOLUTIONS["depthwise_conv2d_native_backprop_filter"].replace(
        swap, depthwise_conv2d_native_backprop_filter
    )


PATCH = Patch(
    summary="Conv2D and its two gradients, the depthwise filter gradient -> "
    "tfdet's fixed-order product kernel "
    "over the image's patches (bits independent of the pool size, the batch, "
    "the vector width and oneDNN)",
    upstream="https://github.com/uxlfoundation/oneDNN/issues/1443",
    apply=_apply,
    kernel=fixed_order.LIBRARY,
    cpu_only=True,
)
