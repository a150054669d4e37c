"""The kernel gradient of a strided 1x1 convolution on few channels, correct.

oneDNN's AVX2 backward-by-weights for a 1x1 convolution with a stride
(`jit_1x1:avx2`, NHWC) copies the strided input into a workspace sized for
whole blocks of 8 input channels and writes past it when the input has
fewer: with one thread the process dies of a corrupted heap ("malloc():
invalid chunk size", SIGSEGV), with two the gradient is silently wrong
(docs/measurements.md, "A wrong kernel gradient under the AVX2 cap"). TensorFlow 2.16 to 2.21 all call it whenever oneDNN's kernels
are AVX2 ones: on every CPU without AVX-512, and on every CPU under tfdet's
profile, which caps oneDNN at AVX2. Other filter sizes and 8 or more input
channels take other kernels, which compute it correctly.

This patch computes that gradient as what it is, a product: the input at
the stride's positions, one row per output position, transposed, times the
output gradient (`tf.matmul`, so under `pool_size_free_products` its
product too). Other `Conv2DBackpropFilter` calls go to the op they went to.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_FILTER_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "conv2d_backprop_filter"
)

# oneDNN's block of input channels in its AVX2 kernels (8 float32 lanes):
# inputs with fewer channels are the ones whose workspace it overruns.
_CHANNEL_BLOCK = 8


def _pointwise_strided(input_shape: Any, filter_shape: Any, strides: Any) -> bool:
    """Whether the call is a strided 1x1 filter on fewer channels than a block."""
    height, width, channels = (filter_shape[i] for i in range(3))
    return (
        (height, width) == (1, 1)
        and (int(strides[1]) > 1 or int(strides[2]) > 1)
        and channels is not None
        and channels < _CHANNEL_BLOCK
        and input_shape[-1] == channels
    )


def conv2d_backprop_filter(
    input: Any,  # noqa: A002 - TensorFlow's argument name
    filter_sizes: Any,
    out_backprop: Any,
    strides: Any,
    padding: Any,
    use_cudnn_on_gpu: bool = True,
    explicit_paddings: Any = (),
    data_format: Any = "NHWC",
    dilations: Any = (1, 1, 1, 1),
    name: str | None = None,
) -> Any:
    """`tf.raw_ops.Conv2DBackpropFilter`, a product for strided 1x1 filters."""
    import tensorflow as tf

    x = tf.convert_to_tensor(input)
    sizes = _exact_math.static_shape(filter_sizes)
    data_format = _exact_math.attribute_text(data_format, "NHWC")
    padding = _exact_math.attribute_text(padding, "VALID")
    if (
        x.dtype != tf.float32
        or data_format != "NHWC"
        or padding not in ("SAME", "VALID")
        or sizes.rank != 4
        or not _pointwise_strided(x.shape, sizes, strides)
    ):
        return _exact_math.call_convolution(
            _FILTER_GRAD.original,
            (input, filter_sizes, out_backprop),
            strides,
            padding,
            use_cudnn_on_gpu,
            explicit_paddings,
            data_format,
            dilations,
            name,
        )
    channels, filters = sizes[2], sizes[3]
    with tf.name_scope(name or "DeterministicStridedPointwiseFilterGrad"):
        upstream = tf.convert_to_tensor(out_backprop)
        # A 1x1 filter pads nothing under "SAME": output (i, j) reads input
        # (i * stride, j * stride) either way.
        rows = tf.shape(upstream)[1]
        columns = tf.shape(upstream)[2]
        picked = x[:, :: int(strides[1]), :: int(strides[2]), :][:, :rows, :columns]
        product = tf.matmul(
            tf.reshape(picked, [-1, channels]),
            tf.reshape(upstream, [-1, filters]),
            transpose_a=True,
        )
        return tf.reshape(product, [1, 1, channels, filters])


PATCH = Patch(
    summary="Conv2DBackpropFilter of a strided 1x1 filter on < 8 channels "
    "(oneDNN AVX2: heap overrun, wrong gradient) -> strided slice x MatMul",
    upstream="https://github.com/uxlfoundation/oneDNN/issues/6035",
    apply=lambda swap: _FILTER_GRAD.replace(swap, conv2d_backprop_filter),
    requires={"tensorflow": ">=2.16"},
)
