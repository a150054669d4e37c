"""The portable math library (`src/portable_math.cc`): functions and sums with
the same bits on x86-64 and aarch64.

Its ops, and the gradients registered for them once it loads:

- `TfdetPortableUnary(x, function)`: exp, log, log1p, expm1, tanh, sigmoid,
  sin, cos; `TfdetPortablePow(x, y)`: x ** y (y a number or of x's shape);
- `TfdetPortableGradient(y, dy, function)`: TensorFlow's TanhGrad and
  SigmoidGrad;
- `TfdetFixedOrderSum(input, reduction_indices, keep_dims, mean)`:
  TensorFlow's Sum or Mean, in an order fixed by the shape.

`tfdet.patches.portable_math` and `tfdet.patches.fixed_order_sums` call
them where the library loads, and TensorFlow's own ops where it does not.
"""

from __future__ import annotations

import platform
from typing import Any

from tfdet import _cpuinfo
from tfdet._kernels import build, library


def _register_gradients(tf: Any) -> None:
    """Registers the ops' gradients (once a process: TensorFlow refuses two)."""
    tf.RegisterGradient("TfdetPortableUnary")(_unary_gradient)
    tf.RegisterGradient("TfdetPortableGradient")(_gradient_gradient)
    tf.RegisterGradient("TfdetFixedOrderSum")(_sum_gradient)
    tf.RegisterGradient("TfdetPortablePow")(_pow_gradient)


def _unusable() -> str | None:
    """Why this CPU cannot run the library: on x86-64 it is built for AVX2
    (as TensorFlow's wheels build Eigen's functions: the same bits, at
    their speed; AVX alone runs some of them at a fifth of it)."""
    if platform.machine() != "x86_64":
        return None
    flags = _cpuinfo.flags()
    # No flags: not Linux, where the build decides (tfdet ships for Linux).
    if flags and "avx2" not in flags:
        return "it is built for AVX2, which this CPU does not have"
    return None


LIBRARY = library.KernelLibrary(
    build.SOURCES / "portable_math.cc",
    fallback="exp, log, tanh, sigmoid and sums run as TensorFlow's own ops "
    "(their bits then differ between x86-64 and aarch64)",
    register=_register_gradients,
    unusable=_unusable,
)


def _unary_gradient(op: Any, upstream: Any) -> Any:
    """TensorFlow's registered gradient of each function (`math_grad.py`),
    the functions it calls computed by the library too, and `upstream *
    reciprocal(x)` as one correctly rounded `upstream / x`, so that the
    gradient is as portable as the function whatever else is patched.

    Through `divide`: where the loss is a plain sum, Grappler folds the
    upstream gradient into a constant of ones and `ones / x` into
    TensorFlow's approximate `Reciprocal`, which parted the cross-entropies'
    gradients between x86-64 and aarch64."""
    x, y = op.inputs[0], op.outputs[0]
    function = op.get_attr("function").decode()
    if function == "exp":
        return upstream * y
    if function == "log":
        return divide(upstream, x)
    if function == "log1p":
        return divide(upstream, 1 + x)
    if function == "expm1":
        return upstream * unary("exp", x)
    if function == "sin":
        return upstream * unary("cos", x)
    if function == "cos":
        return -upstream * unary("sin", x)
    return gradient(function, y, upstream)


def _pow_gradient(op: Any, upstream: Any) -> Any:
    """TensorFlow's registered Pow gradient (`math_grad._PowGrad`), its sum
    over the exponent's broadcast where the exponent is a number, the pow
    and log in it the library's."""
    import tensorflow as tf

    x, y = op.inputs
    z = op.outputs[0]
    grad_x = upstream * y * LIBRARY.load().tfdet_portable_pow(x, y - 1)
    # 0 where x <= 0: log(x) is not real there (TensorFlow's own choice).
    positive = x > 0
    safe_x = tf.where(positive, x, tf.ones_like(x))
    log_x = tf.where(positive, unary("log", safe_x), tf.zeros_like(x))
    grad_y = upstream * z * log_x
    if y.shape.rank == 0:  # Summed in the library's order too.
        grad_y = LIBRARY.load().tfdet_fixed_order_sum(grad_y, tf.range(tf.rank(grad_y)))
    return grad_x, grad_y


def _gradient_gradient(op: Any, upstream: Any) -> Any:
    """TensorFlow's second-order gradients of TanhGrad and SigmoidGrad."""
    y, dy = op.inputs
    function = op.get_attr("function").decode()
    if function == "tanh":
        return upstream * -2.0 * dy * y, gradient("tanh", y, upstream)
    scaled = upstream * dy
    return scaled - 2.0 * scaled * y, gradient("sigmoid", y, upstream)


def _sum_gradient(op: Any, upstream: Any) -> Any:
    """TensorFlow's Sum and Mean gradients (`math_grad._SumGrad`, `_MeanGrad`):
    each element's share of the upstream gradient, over the count for the
    mean."""
    import tensorflow as tf

    x, axes = op.inputs
    shape = tf.shape(x)
    rank = tf.size(shape)
    axes = tf.reshape(tf.cast(axes, tf.int32), [-1])
    axes = (axes + rank) % rank
    kept = tf.tensor_scatter_nd_update(shape, axes[:, None], tf.ones_like(axes))
    if op.get_attr("mean"):
        count = tf.size(x) // tf.maximum(tf.size(op.outputs[0]), 1)
        upstream = upstream / tf.cast(count, upstream.dtype)
    return tf.broadcast_to(tf.reshape(upstream, kept), shape), None


def unary(function: str, x: Any) -> Any:
    """`function` of `x` by the library (loaded: its ops' gradients run only
    where it is)."""
    return LIBRARY.load().tfdet_portable_unary(x, function=function)


def divide(numerator: Any, denominator: Any) -> Any:
    """`numerator / denominator`, one correctly rounded division per element,
    whatever Grappler knows of the numerator: for a numerator that may be a
    constant of ones (a number, a gradient's upstream). It costs a
    multiplication over the result; a numerator computed from the inputs
    (a softmax's exponentials) needs none of it.

    Grappler folds a numerator it knows to be ones (`1 / x`; a gradient whose
    upstream is a plain sum's) into TensorFlow's `Reciprocal`, whose float32
    kernel is an approximate instruction plus a Newton step (RCPPS on x86-64,
    FRECPE on aarch64): other bits on each architecture and CPU model.
    Multiplied by ones that depend on the denominator's values (`x == x or
    x != x` holds for every float, nan included), the numerator is no
    constant it can fold.
    """
    import tensorflow as tf
    from tensorflow.python.ops import gen_math_ops

    ones = tf.cast(
        tf.logical_or(
            tf.equal(denominator, denominator), tf.not_equal(denominator, denominator)
        ),
        denominator.dtype,
    )
    return gen_math_ops.real_div(numerator * ones, denominator)


def gradient(function: str, y: Any, upstream: Any) -> Any:
    """TanhGrad or SigmoidGrad of the function's output `y`: the library's
    where it loads, else TensorFlow's op."""
    import tensorflow as tf

    loaded = LIBRARY.load()
    if loaded is None:
        op = tf.raw_ops.TanhGrad if function == "tanh" else tf.raw_ops.SigmoidGrad
        return op(y=y, dy=upstream)
    return loaded.tfdet_portable_gradient(y, upstream, function=function)
