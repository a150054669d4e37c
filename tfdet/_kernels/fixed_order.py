"""tfdet's own matrix products and convolutions, bits fixed by the shapes alone.

The kernel (`fixed_order_products.cc`, beside this module) sums every output
element's K terms in one chain of fused multiply-adds, k = 0 .. K-1 (a
long K, 8,192 terms or more, in blocks whose number and bounds follow K
alone, each block one such chain and the blocks' sums added in order), and
splits the work over output tiles and those blocks, so its bits do not follow the
thread count, the row count (a sample's batch) or the vector width (its
AVX-512, AVX2 and scalar paths give the same bits). A 2-D convolution (NHWC,
float32) and its two gradients are the same product over the image's
patches, read from the image itself. See the source's header.

It is a TensorFlow custom op, installed with tfdet or built at first use
and cached (`tfdet._kernels.library`); where it cannot be had, `load()`
returns None and says so once, and the callers compute the products as the
pool-size-free composition. The AVX2 and AVX-512 micro-kernels are
compiled by target attributes and chosen by CPUID at run time, so the rest
runs on any x86-64.

`TFDET_FIXED_ORDER_ISA=avx2` or `=scalar` makes the kernel use that
narrower path on any CPU that has it (the tests compare the paths).
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels import build, library

# "avx2" or "scalar" asks for that micro-kernel rather than the CPU's widest
# (read by the kernel at each call).
ISA_VARIABLE = "TFDET_FIXED_ORDER_ISA"


def _register_gradients(tf: Any) -> None:
    """Registers the ops' gradients (once a process: TensorFlow refuses two)."""
    tf.RegisterGradient("TfdetFixedOrderMatMul")(_mat_mul_gradient)
    tf.RegisterGradient("TfdetFixedOrderBatchMatMul")(_batch_mat_mul_gradient)
    tf.RegisterGradient("TfdetFixedOrderConv2D")(_conv2d_gradient)
    tf.RegisterGradient("TfdetFixedOrderConv2DBackpropInput")(_input_gradient_gradient)
    tf.RegisterGradient("TfdetFixedOrderConv2DBackpropFilter")(
        _filter_gradient_gradient
    )


LIBRARY = library.KernelLibrary(
    build.SOURCES / "fixed_order_products.cc",
    fallback="products and convolutions use the slower pool-size-free "
    "composition instead, with other bits (the profile's `kernels` lists the "
    "patches whose kernel ran)",
    register=_register_gradients,
)
load = LIBRARY.load


def vector_path() -> str:
    """The kernel's vector path in this process now: avx512, avx2, neon or scalar.

    The widest the CPU has, or the narrower one `TFDET_FIXED_ORDER_ISA`
    names; every path gives the same bits.
    """
    return load().tfdet_fixed_order_vector_path().numpy().decode()


def plan(batch: int, m: int, n: int, k: int, pool: int) -> dict[str, int]:
    """How the kernel would split `batch` products (m x k) @ (k x n) over a
    pool of `pool` threads, on the vector path `vector_path()` names: the
    threads it uses, the K blocks of its sums (the only part that decides
    bits), its tasks and its tiles' rows and columns. Nothing is computed.
    """
    values = load().tfdet_fixed_order_plan([batch, m, n, k, pool]).numpy()
    keys = ("threads", "k_blocks", "tasks", "tile_rows", "tile_columns")
    return dict(zip(keys, map(int, values), strict=True))


def matmul(a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False) -> Any:
    """`a @ b` of 2-D float32 matrices by the kernel (which must load)."""
    return load().tfdet_fixed_order_mat_mul(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b
    )


def batch_matmul(x: Any, y: Any, adj_x: bool = False, adj_y: bool = False) -> Any:
    """`x @ y` over broadcast batch dimensions, by the kernel."""
    return load().tfdet_fixed_order_batch_mat_mul(x, y, adj_x=adj_x, adj_y=adj_y)


def _mat_mul_gradient(op: Any, grad: Any) -> tuple[Any, Any]:
    """MatMul's gradients, each again a fixed-order product.

    TensorFlow's own formulas (`math_grad._MatMulGrad`) with its products
    replaced: the transpose flags choose which operand is read transposed.
    """
    a, b = op.inputs
    t_a, t_b = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    if not t_a and not t_b:
        return matmul(grad, b, transpose_b=True), matmul(a, grad, transpose_a=True)
    if not t_a and t_b:
        return matmul(grad, b), matmul(grad, a, transpose_a=True)
    if t_a and not t_b:
        return matmul(b, grad, transpose_b=True), matmul(a, grad)
    return (
        matmul(b, grad, transpose_a=True, transpose_b=True),
        matmul(grad, a, transpose_a=True, transpose_b=True),
    )


def _batch_mat_mul_gradient(op: Any, grad: Any) -> tuple[Any, Any]:
    """BatchMatMulV2's gradients (`math_grad._BatchMatMulV2Grad`'s formulas).

    The gradient of a broadcast operand is summed over the batch axes it
    was broadcast along: a `Sum` over those axes, which splits only over
    its outputs.
    """
    import tensorflow as tf

    x, y = op.inputs
    adj_x, adj_y = op.get_attr("adj_x"), op.get_attr("adj_y")
    if not adj_x and not adj_y:
        gx, gy = batch_matmul(grad, y, adj_y=True), batch_matmul(x, grad, adj_x=True)
    elif not adj_x and adj_y:
        gx, gy = batch_matmul(grad, y), batch_matmul(grad, x, adj_x=True)
    elif adj_x and not adj_y:
        gx, gy = batch_matmul(y, grad, adj_y=True), batch_matmul(x, grad)
    else:
        gx = batch_matmul(y, grad, adj_x=True, adj_y=True)
        gy = batch_matmul(grad, x, adj_x=True, adj_y=True)
    shape_x, shape_y = tf.shape(x), tf.shape(y)
    axes_x, axes_y = tf.raw_ops.BroadcastGradientArgs(s0=shape_x[:-2], s1=shape_y[:-2])
    gx = tf.reshape(tf.reduce_sum(gx, axes_x), shape_x)
    gy = tf.reshape(tf.reduce_sum(gy, axes_y), shape_y)
    return gx, gy


def _convolution(op: str, *inputs: Any, **attributes: Any) -> Any:
    """The library's convolution op `op` on `inputs`, given Conv2D's
    attributes (`strides`, `padding`, `explicit_paddings`, `dilations`;
    the lists as lists, as the generated op wants them)."""
    for name in ("strides", "explicit_paddings", "dilations"):
        if name in attributes:
            attributes[name] = list(attributes[name])
    return getattr(load(), op)(*inputs, **attributes)


def conv2d(x: Any, kernel: Any, **attributes: Any) -> Any:
    """`tf.raw_ops.Conv2D` of an NHWC float32 `x` and an HWIO `kernel`.

    The kernel's channels must be x's (no groups). `attributes` are
    Conv2D's: `strides`, `padding`, and optionally `explicit_paddings`
    and `dilations`.
    """
    return _convolution("tfdet_fixed_order_conv2d", x, kernel, **attributes)


def conv2d_backprop_input(
    input_sizes: Any, kernel: Any, out_backprop: Any, **attributes: Any
) -> Any:
    """`tf.raw_ops.Conv2DBackpropInput` (NHWC, float32), by the kernel."""
    return _convolution(
        "tfdet_fixed_order_conv2d_backprop_input",
        input_sizes,
        kernel,
        out_backprop,
        **attributes,
    )


def conv2d_backprop_filter(
    x: Any, filter_sizes: Any, out_backprop: Any, **attributes: Any
) -> Any:
    """`tf.raw_ops.Conv2DBackpropFilter` (NHWC, float32), by the kernel."""
    return _convolution(
        "tfdet_fixed_order_conv2d_backprop_filter",
        x,
        filter_sizes,
        out_backprop,
        **attributes,
    )


def depthwise_conv2d_backprop_filter(
    x: Any, filter_sizes: Any, out_backprop: Any, **attributes: Any
) -> Any:
    """`tf.raw_ops.DepthwiseConv2dNativeBackpropFilter` (NHWC, float32, a
    depth multiplier of 1), by the kernel."""
    return _convolution(
        "tfdet_fixed_order_depthwise_conv2d_native_backprop_filter",
        x,
        filter_sizes,
        out_backprop,
        **attributes,
    )


def _attributes(op: Any) -> dict[str, Any]:
    """A convolution op's attributes, to give the ops of its gradient."""
    return {
        name: op.get_attr(name)
        for name in ("strides", "padding", "explicit_paddings", "dilations")
    }


def _conv2d_gradient(op: Any, grad: Any) -> tuple[Any, Any]:
    """Conv2D's gradients (`nn_grad._Conv2DGrad`'s), each by the kernel."""
    import tensorflow as tf

    x, kernel = op.inputs
    attributes = _attributes(op)
    return (
        conv2d_backprop_input(tf.shape(x), kernel, grad, **attributes),
        conv2d_backprop_filter(x, tf.shape(kernel), grad, **attributes),
    )


def _input_gradient_gradient(op: Any, grad: Any) -> tuple[None, Any, Any]:
    """`nn_grad._Conv2DBackpropInputGrad`'s formulas, by the kernel."""
    import tensorflow as tf

    _, kernel, out_backprop = op.inputs
    attributes = _attributes(op)
    return (
        None,
        conv2d_backprop_filter(grad, tf.shape(kernel), out_backprop, **attributes),
        conv2d(grad, kernel, **attributes),
    )


def _filter_gradient_gradient(op: Any, grad: Any) -> tuple[Any, None, Any]:
    """`nn_grad._Conv2DBackpropFilterGrad`'s formulas, by the kernel."""
    import tensorflow as tf

    x, _, out_backprop = op.inputs
    attributes = _attributes(op)
    return (
        conv2d_backprop_input(tf.shape(x), grad, out_backprop, **attributes),
        None,
        conv2d(x, grad, **attributes),
    )
