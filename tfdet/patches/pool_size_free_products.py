"""Bits that follow neither the thread-pool size nor the batch.

With oneDNN on, TensorFlow's CPU `MatMul` is oneDNN's sgemm, whose work is
split among the pool's threads by output columns (and, with AVX2, capped by
the L2 cache per core): the last columns of each thread's share go through
a remainder micro-kernel that sums with other accumulators (two partial
sums for even and odd k, or multiply-then-add instead of FMA), so which
columns end up in a remainder, and so their bits, follow the pool size, and
which rows do follow the number of rows: a sample's bits follow its batch.
`Conv2DBackpropFilter` (oneDNN's backward-by-weights) splits its sum over
the batch and the image among threads when it has few jobs and adds the
partial sums afterwards; `Conv2DBackpropInput` of a strided convolution
splits by the pool too; `BiasAddGrad` (TensorFlow's `ReduceOuterDimensions`)
splits the rows into up to one block per thread when there are few
channels. Each gives other bits with another pool size, under one seed.

oneDNN's forward convolution splits work only over its outputs (images,
output channels, positions) and sums every output's channels inside one
thread, in the same order whatever the pool size and whatever the number of
images from two on (docs/measurements.md, "Cost of bits that do not follow
the pool size" and "Batch size"). So this patch computes
each product as one:

- `MatMul` a (m x k) @ b (k x n): a 1x1 convolution by an (1, 1, k, n)
  filter of images of 8 pixels (rows of a) with k channels, each image
  computed by one thread; its gradients are the same kind of product
  (dy @ b^T, a^T @ dy), never sgemm;
- `BatchMatMulV2/V3` (batch, m, k) @ (batch, k, n): the same, with one
  convolution group per batch entry (batch shapes broadcast, known or not
  when traced); `Einsum` through TensorFlow's Python decomposition
  (`_einsum_v1`: transposes, reshapes and those products);
- `Conv2D`: TensorFlow's, but never on a batch of one image, which oneDNN
  computes with another kernel (one zero image beside it);
- `Conv2DBackpropFilter`: the image patches (strided slices, a copy)
  transposed, times the output gradient, as above;
- `Conv2DBackpropInput`: a forward convolution of the output gradient
  (zeros between its values for a stride, padded by the filter's reach) by
  the filter reversed in space, its channels swapped;
- `BiasAddGrad`: a `Sum` over every axis but the channels, which splits
  only over the channels;
- `DepthwiseConv2dNativeBackpropFilter` (depthwise and separable
  convolutions' filter gradient, which TensorFlow splits by images): per
  filter position, such a `Sum` of the input's strided slice times the
  output gradient;
- tf_keras's `BatchNormalization`: computed unfused (`tf.nn.moments`, a
  `Mean` over every axis but the channels, and element-wise ops) instead of
  the fused kernel (`FusedBatchNormV3`), whose training-time sums over the
  batch split by the pool (a layer asked for `fused=True` too); Keras 3's
  is unfused already;
- `tf.nn.gelu`'s exact form without the division that Grappler rewrites in
  a traced function on TensorFlow 2.16-2.18 (eager and traced agree);
- element-wise functions whose last `length % lanes` elements Eigen
  computes with another approximation (Sigmoid, Exp, Log, Softplus, Elu,
  Pow, ...: `tfdet.patches._whole_packets`): on whole packets.

Together: with the patch, each sample's output bits do not depend on what
else is in its batch (`model.predict` at any batch size, in any order, or
`model(x[i:j])`), and a model's weights do not depend on the pool size.
Except under TensorFlow 2.19's oneDNN (v3.5), which on some CPUs (an AMD
Zen 3) computes a 1x1 convolution of 1024 input channels and more with
one kernel from 8 images on and another below: there a product's bits
follow the batch (`fixed_order_products` keeps them).

Values agree with the originals to float32 rounding (the sums run in
another order). float32 only (NHWC for convolutions); anything else, and
what the replacements cannot compute (a product with an empty dimension, a
grouped convolution's gradients, an `Einsum` with a diagonal such as
"ii->i"), goes to the original op. Not covered (still following the pool
size with the patch): 3-D convolution filter gradients, and a full `Sum`
or `Mean` large enough for Eigen to split it into one block per thread
(of 256x4096 elements; a training step's loss, a mean over one batch,
stays on one thread). Cost:
`benchmarks/patch_cost.py --patch pool_size_free_products`,
`benchmarks/cost_of_determinism.py` and `benchmarks/batch_invariance.py`.

Installed by "auto" (`tfdet.enable()`'s default), with tfdet's kernels
computing the products and convolutions where they load; `tfdet check
--perturb threads` shows it on a model.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdet._kernels.library import tracing_for_xla
from tfdet.patches import _exact_math, _registry, _whole_packets
from tfdet.patches._registry import Patch
from tfdet.patches._swap import Swap

_MAT_MUL = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "mat_mul")
_CONV = _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", "conv2d")
_FILTER_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "conv2d_backprop_filter"
)
_INPUT_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "conv2d_backprop_input"
)
_DEPTHWISE_FILTER_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "depthwise_conv2d_native_backprop_filter"
)
_BIAS_GRAD = _exact_math.GeneratedOp(
    "tensorflow.python.ops.gen_nn_ops", "bias_add_grad"
)
_BATCH_MAT_MUL = {
    version: _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", version)
    for version in ("batch_mat_mul_v2", "batch_mat_mul_v3")
}
_EINSUM = _exact_math.GeneratedOp("tensorflow.python.ops.gen_linalg_ops", "einsum")
# Not a generated wrapper, but bound the same ways (`tf.nn.gelu` is it).
_GELU = _exact_math.GeneratedOp("tensorflow.python.ops.nn_ops", "gelu")


# Rows of a product per image of the convolution. oneDNN splits the work of
# a 1x1 convolution over images and output-channel blocks, so each image is
# computed whole by one thread, the same way for every pool size. One row
# per image makes each image a vector-matrix product that reads the whole
# filter again; 8 rows reuse it, at about half that cost (`benchmarks/
# patch_cost.py`), with bits as free of the pool size. One image of all the
# rows follows the pool size: oneDNN then splits the image.
_ROWS_PER_IMAGE = 8


def _batch_product(a: Any, b: Any) -> Any:
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


def _batch_matmul(a: Any, b: Any) -> Any:
    import tensorflow as tf

    swap = tf.linalg.matrix_transpose

    @tf.custom_gradient
    def run(a: Any, b: Any) -> Any:
        def gradient(upstream: Any) -> tuple[Any, Any]:
            return (
                _batch_product(upstream, swap(b)),
                _batch_product(swap(a), upstream),
            )

        return _batch_product(a, b), gradient

    return run(a, b)


def _has_no_elements(*shapes: Any) -> bool:
    """Whether a dimension of the product's matrices is statically 0.

    oneDNN refuses a convolution whose filter has no elements; TensorFlow's
    products return the empty or zero result, so those go to the original.
    """
    return any(dimension == 0 for shape in shapes for dimension in shape)


def _tensorflows_under_xla(op: _exact_math.GeneratedOp) -> Any:
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


def mat_mul_left_to_tensorflow(a: Any, b: Any) -> bool:
    """Whether a `MatMul` of tensors `a` and `b` stays TensorFlow's own op.

    The product patches (this one and `fixed_order_products`) compute
    float32 products with no statically empty dimension.
    """
    import tensorflow as tf

    return (
        a.dtype != tf.float32
        or b.dtype != tf.float32
        or _has_no_elements(a.shape, b.shape)
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
        or _has_no_elements(a.shape[-2:], b.shape[-2:])
    )
    return left, "an unknown rank" if unknown else None


def _batch_mat_mul(version: str) -> Any:
    """The replacement of `gen_math_ops.<version>` (BatchMatMulV2 or V3)."""

    @_tensorflows_under_xla(_BATCH_MAT_MUL[version])
    def batch_mat_mul(
        x: Any,
        y: Any,
        *args: Any,
        adj_x: bool = False,
        adj_y: bool = False,
        name: str | None = None,
        **flags: Any,
    ) -> Any:
        import tensorflow as tf

        original = _BATCH_MAT_MUL[version].original
        a, b = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        out_type = args[0] if args else flags.get("Tout", tf.float32)
        left, reason = batch_mat_mul_left_to_tensorflow(a, b, out_type)
        if left:
            _whole_packets.left_to_tensorflow("BatchMatMul", a.dtype, reason)
            return original(x, y, *args, adj_x=adj_x, adj_y=adj_y, name=name, **flags)
        with tf.name_scope(name or "PoolSizeFreeBatchMatMul"):
            # Batch shapes broadcast as TensorFlow's op does them, known or
            # not when traced (a Keras step's batch is not): falling back to
            # the original op for an unknown batch would give other bits
            # than the same product traced with a known one.
            static_batch = tf.broadcast_static_shape(a.shape[:-2], b.shape[:-2])
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
            product = _batch_matmul(a, b)
            product = tf.reshape(product, tf.concat([batch, tf.shape(product)[1:]], 0))
            product.set_shape(static_batch.concatenate(product.shape[-2:]))
            return product

    return batch_mat_mul


@_tensorflows_under_xla(_EINSUM)
def einsum(inputs: Any, equation: str, name: str | None = None) -> Any:
    """`tf.raw_ops.Einsum` as transposes, reshapes and the products above.

    TensorFlow's own Python decomposition (`_einsum_v1`), whose products go
    through `tf.matmul`, hence through this patch's `MatMul` and
    `BatchMatMul`.
    """
    import tensorflow as tf
    from tensorflow.python.ops import special_math_ops

    tensors = [tf.convert_to_tensor(x) for x in inputs]
    if any(t.dtype != tf.float32 for t in tensors):
        _whole_packets.left_to_tensorflow("Einsum", tensors[0].dtype)
        return _EINSUM.original(inputs, equation, name=name)
    try:
        return special_math_ops._einsum_v1(equation, *tensors, name=name)
    except ValueError:
        # A subscript the decomposition does not take (a diagonal such as
        # "ii->i"); it raises while building, before any op runs.
        _whole_packets.left_to_tensorflow(
            "Einsum", tensors[0].dtype, f"the equation {equation!r}"
        )
        return _EINSUM.original(inputs, equation, name=name)


def gelu(features: Any, approximate: bool = False, name: str | None = None) -> Any:
    """`tf.nn.gelu`, exact form as TensorFlow 2.19+ writes it, by multiplications.

    TensorFlow 2.16-2.18 compute `0.5 * x * (1 + erf(x / sqrt(2)))`; inside a
    `tf.function`, Grappler's constant folding turns the division by a
    constant into a multiplication by its reciprocal, so a traced function
    (`predict`) gives other bits than eager code (`model(x)`). `0.5 * x * erfc(-x *
    0.7071067811865476)` has no division to rewrite, and is TensorFlow
    2.19+'s own expression, so its bits there are unchanged.
    """
    import tensorflow as tf

    x = tf.convert_to_tensor(features)
    if approximate or x.dtype != tf.float32:
        return _GELU.original(features, approximate=approximate, name=name)
    with tf.name_scope(name or "PoolSizeFreeGelu"):
        return 0.5 * x * tf.math.erfc(-x * 0.7071067811865476)


@_tensorflows_under_xla(_MAT_MUL)
def mat_mul(
    a: Any,
    b: Any,
    transpose_a: bool = False,
    transpose_b: bool = False,
    name: str | None = None,
    **flags: Any,
) -> Any:
    """`tf.raw_ops.MatMul`, bits independent of the pool size for float32."""
    import tensorflow as tf

    a_tensor, b_tensor = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    if mat_mul_left_to_tensorflow(a_tensor, b_tensor):
        _whole_packets.left_to_tensorflow("MatMul", a_tensor.dtype)
        return _MAT_MUL.original(
            a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name, **flags
        )
    with tf.name_scope(name or "PoolSizeFreeMatMul"):
        if transpose_a:
            a_tensor = tf.transpose(a_tensor)
        if transpose_b:
            b_tensor = tf.transpose(b_tensor)
        # A batch of one: one group, a plain 1x1 convolution.
        return _batch_matmul(a_tensor[None], b_tensor[None])[0]


def _static_filter_shape(filter_sizes: Any) -> tuple[int, ...] | None:
    """The filter's shape as numbers, or None when it is not known statically."""
    shape = _exact_math.static_shape(filter_sizes)
    return tuple(shape.as_list()) if shape.is_fully_defined() else None


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


@_tensorflows_under_xla(_FILTER_GRAD)
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
    sizes = _static_filter_shape(filter_sizes)
    data_format, padding = (
        _exact_math.attribute_text(data_format, "NHWC"),
        _exact_math.attribute_text(padding, "VALID"),
    )
    # A grouped convolution's filter has fewer channels than x.
    unsupported = _convolution_unsupported(data_format, _ungrouped(x.shape[-1], sizes))
    if x.dtype != tf.float32 or unsupported is not None:
        _whole_packets.left_to_tensorflow("Conv2DBackpropFilter", x.dtype, unsupported)
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
    height, width, channels, filters = (int(s) for s in sizes)
    with tf.name_scope(name or "PoolSizeFreeConv2DBackpropFilter"):
        x = _padded(x, padding, explicit_paddings, (height, width), strides, dilations)
        patches = _image_patches(
            x, tf.shape(out_backprop), (height, width), strides, dilations
        )
        # Each patch is flattened as (row, column, channel), the filter's order.
        patches = tf.reshape(patches, [-1, height * width * channels])
        upstream = tf.reshape(out_backprop, [-1, filters])
        gradient = _batch_product(tf.transpose(patches)[None], upstream[None])[0]
        return tf.reshape(gradient, [height, width, channels, filters])


@_tensorflows_under_xla(_DEPTHWISE_FILTER_GRAD)
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
    sizes = _static_filter_shape(filter_sizes)
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
        return _DEPTHWISE_FILTER_GRAD.original(
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
    height, width, channels, multiplier = (int(s) for s in sizes)
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
        return _CONV.original(
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


@_tensorflows_under_xla(_CONV)
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
            _CONV.original,
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


def _filter_shape(kernel: Any) -> tuple[int, ...] | None:
    """A filter tensor's shape as numbers, or None when it is not known when
    traced (`_static_filter_shape` reads it from a gradient's `filter_sizes`)."""
    return tuple(kernel.shape.as_list()) if kernel.shape.is_fully_defined() else None


def _ungrouped(channels: Any, filter_shape: tuple[int, ...] | None) -> bool:
    """Whether the filter's shape (HWIO) is known and has the image's
    `channels` (None where unknown): a grouped convolution's filter has fewer."""
    return (
        filter_shape is not None
        and channels is not None
        and filter_shape[2] == channels
    )


def _convolution_unsupported(data_format: str, ungrouped: bool) -> str | None:
    """What a convolution's gradient replacement cannot take, or None.

    Args:
        data_format: The convolution's; only NHWC is computed here.
        ungrouped: Whether the filter's shape is known and has x's channels.
    """
    if data_format != "NHWC":
        return data_format
    if not ungrouped:
        return "a grouped convolution or an unknown filter shape"
    return None


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


@_tensorflows_under_xla(_INPUT_GRAD)
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
    four = four_input_sizes(input_sizes, kernel, upstream, data_format)
    # A grouped convolution's filter has fewer channels than x.
    unsupported = (
        "input sizes that are not 4 or 2 numbers"
        if four is None
        else _convolution_unsupported(
            data_format,
            _ungrouped(_exact_math.static_shape(four)[3], _filter_shape(kernel)),
        )
    )
    if upstream.dtype != tf.float32 or unsupported is not None:
        _whole_packets.left_to_tensorflow(
            "Conv2DBackpropInput", upstream.dtype, unsupported
        )
        return _exact_math.call_convolution(
            _INPUT_GRAD.original,
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
        count = len(input_sizes)
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
        return _BIAS_GRAD.original(out_backprop, data_format=data_format, name=name)
    data_format = _exact_math.attribute_text(data_format, "NHWC")
    channel = 1 if data_format.startswith("NC") and rank > 2 else rank - 1
    axes = [axis for axis in range(rank) if axis != channel]
    with tf.name_scope(name or "PoolSizeFreeBiasAddGrad"):
        return tf.reduce_sum(upstream, axis=axes)


# The op types this patch computes apart from the pool size.
COVERED = (
    "Conv2DBackpropInput",
    "MatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2DBackpropFilter",
    "DepthwiseConv2dNativeBackpropFilter",
    "BiasAddGrad",
    # Not replaced: tf_keras's BatchNormalization, which reaches it, is
    # built unfused instead (a direct `tf.nn.fused_batch_norm` still runs it).
    "FusedBatchNormV3",
)
# The op types this patch computes apart from the batch size (and with
# them, `COVERED`): each sample's bits do not follow what else is in its
# batch.
BATCH_SIZE_FREE = (*COVERED, "Conv2D", "Pow", *_whole_packets.UNARY)


# tfdet's own product kernel: with these installed (before this patch, in
# name order), the products (the convolutions) are its, one op each instead
# of a padded convolution and its plumbing, as free of the pool size and the
# batch (where it cannot compute one, it calls this patch's composition).
_KERNEL_PRODUCTS = "fixed_order_products"
_KERNEL_CONVOLUTIONS = "fixed_order_convolutions"


def warn_without_onednn() -> None:
    """Says once that the bits follow the pool size where oneDNN is off.

    The compositions above rely on oneDNN's forward convolution, which
    splits work over outputs only. Without oneDNN (enable()'s default on
    aarch64, or `onednn=None` where TensorFlow leaves it off) Eigen's
    convolution computes them, and measured on emulated aarch64 (QEMU `max`,
    TF 2.21) the built-in CNN and BatchNorm + GELU model trained to other
    weights with pools of 1 and 3 under this patch.
    """
    from tfdet._pin import _environment

    if _environment.onednn_custom_ops() is False:
        _exact_math.warn_once(
            "tfdet: pool_size_free_products computes its products through "
            "oneDNN's convolution, and TensorFlow's oneDNN custom ops are off "
            "here: the bits may still follow the thread-pool size (measured on "
            "aarch64). Use threads=1 for bits that do not."
        )


def _apply(swap: Any) -> None:

    warn_without_onednn()
    installed = _registry.installed()
    if _KERNEL_PRODUCTS not in installed:
        _MAT_MUL.replace(swap, mat_mul)
        for version, op in _BATCH_MAT_MUL.items():
            op.replace(swap, _batch_mat_mul(version))
        _EINSUM.replace(swap, einsum)
    if _KERNEL_CONVOLUTIONS not in installed:
        _CONV.replace(swap, conv2d)
        _FILTER_GRAD.replace(swap, conv2d_backprop_filter)
        _INPUT_GRAD.replace(swap, conv2d_backprop_input)
        _DEPTHWISE_FILTER_GRAD.replace(swap, depthwise_conv2d_native_backprop_filter)
    _GELU.replace(swap, gelu)
    _BIAS_GRAD.replace(swap, bias_add_grad)
    _whole_packets.apply(swap)


def _unfused_tf_keras_batch_norm(swap: Swap) -> None:
    """tf_keras's `BatchNormalization` layers are built unfused.

    `build` decides: it keeps `fused` False, so the layer computes its
    batch statistics with `tf.nn.moments` (covered above) wherever the
    fused kernel would have run.
    """
    from tf_keras.src.layers.normalization import batch_normalization

    base = batch_normalization.BatchNormalizationBase
    original = base.build

    @functools.wraps(original)
    def build(self: Any, input_shape: Any) -> None:
        self.fused = False
        original(self, input_shape)

    swap.attribute(base, "build", build)


PATCH = Patch(
    summary="MatMul, BatchMatMul, Einsum, Conv2D and its gradients, the depthwise "
    "filter gradient, BiasAddGrad, "
    "Sigmoid/Exp/Log/..., tf_keras' fused BatchNormalization -> 1x1 "
    "convolutions, Sums, whole packets and unfused moments that split only over "
    "outputs (bits independent of the pool size and the batch)",
    upstream="https://github.com/uxlfoundation/oneDNN/issues/1443",
    apply=_apply,
    after_import=(("tf_keras", _unfused_tf_keras_batch_norm),),
    cpu_only=True,
)
