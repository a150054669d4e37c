"""Element-wise functions whose bits do not follow the tensor's length.

TensorFlow's CPU kernels for element-wise functions (Eigen) compute a tensor
in packets of several float32 lanes and its last `length % lanes` elements
with the scalar function, which for sigmoid, exp, log and others is another
approximation: other bits. So an element's bits follow its tensor's length
and its place in it, and a sample predicted in a batch of 7 gets other
output bits than in a batch of 32: Sigmoid, Exp, Log, Log1p, Expm1, Erfc,
Softplus, Elu, Selu, Pow, Sin and Cos (Tanh, Erf and arithmetic are equal in
both paths; docs/measurements.md, "Batch size"). A `Dense(1, activation="sigmoid")`
head, a binary classifier's, meets it whenever its batch is not a multiple
of the lanes.

Here each of those functions is computed on its input flattened and padded
with zeros to a whole number of `PACKET` elements, then cut back: every
element goes through the packet path, whatever the length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdet._patching import _exact_math
from tfdet._patching._swap import Swap

# Elements per pad: a multiple of every float32 packet Eigen uses (4 on
# NEON, 8 on AVX, the TensorFlow wheels' build, 16 on AVX-512).
PACKET = 16

_MATH = "tensorflow.python.ops.gen_math_ops"
_NN = "tensorflow.python.ops.gen_nn_ops"
UNARY = {
    "Sigmoid": _exact_math.GeneratedOp(_MATH, "sigmoid"),
    "Exp": _exact_math.GeneratedOp(_MATH, "exp"),
    "Log": _exact_math.GeneratedOp(_MATH, "log"),
    "Log1p": _exact_math.GeneratedOp(_MATH, "log1p"),
    "Expm1": _exact_math.GeneratedOp(_MATH, "expm1"),
    "Erfc": _exact_math.GeneratedOp(_MATH, "erfc"),
    "Sin": _exact_math.GeneratedOp(_MATH, "sin"),
    "Cos": _exact_math.GeneratedOp(_MATH, "cos"),
    "Softplus": _exact_math.GeneratedOp(_NN, "softplus"),
    "Elu": _exact_math.GeneratedOp(_NN, "elu"),
    "Selu": _exact_math.GeneratedOp(_NN, "selu"),
}
POW = _exact_math.GeneratedOp(_MATH, "_pow")


def left_to_tensorflow(op_type: str, dtype: Any, reason: str | None = None) -> None:
    """Says once that `pool_size_free_products` left an input to TensorFlow."""
    _exact_math.left_to_tensorflow("pool_size_free_products", op_type, dtype, reason)


def _padded(flat: Any) -> Any:
    """`flat` (rank 1) and zeros up to a whole number of packets."""
    import tensorflow as tf

    missing = (-tf.size(flat)) % PACKET
    return tf.concat([flat, tf.zeros([missing], flat.dtype)], 0)


def _on_whole_packets(
    function: Callable[..., Any], tensors: list[Any], scope: str
) -> Any:
    """`function(*tensors)` with each tensor padded; the result cut back."""
    import tensorflow as tf

    shape = tensors[0].shape
    with tf.name_scope(scope):
        flat = [tf.reshape(t, [-1]) for t in tensors]
        result = function(*[_padded(f) for f in flat])
        result = tf.reshape(result[: tf.size(flat[0])], tf.shape(tensors[0]))
        result.set_shape(shape)
        return result


def _unary(op_type: str) -> Callable[..., Any]:
    generated = UNARY[op_type]

    def replacement(x: Any, name: str | None = None) -> Any:
        import tensorflow as tf

        tensor = tf.convert_to_tensor(x)
        if tensor.dtype != tf.float32:
            left_to_tensorflow(op_type, tensor.dtype)
            return generated.original(x, name=name)
        return _on_whole_packets(
            generated.original, [tensor], name or f"PoolSizeFree{op_type}"
        )

    return replacement


def _pow(x: Any, y: Any, name: str | None = None) -> Any:
    """`Pow` where both have one shape, or one is a number: on whole packets."""
    import tensorflow as tf

    base = tf.convert_to_tensor(x)
    # A Python number takes the base's dtype, as the op's own conversion does.
    exponent = tf.convert_to_tensor(y, dtype_hint=base.dtype)
    if base.dtype != tf.float32 or exponent.dtype != tf.float32:
        left_to_tensorflow("Pow", base.dtype)
        return POW.original(x, y, name=name)
    scope = name or "PoolSizeFreePow"
    if exponent.shape.rank == 0:
        return _on_whole_packets(lambda b: POW.original(b, exponent), [base], scope)
    if base.shape.rank == 0:
        return _on_whole_packets(lambda e: POW.original(base, e), [exponent], scope)
    if base.shape.is_fully_defined() and base.shape == exponent.shape:
        return _on_whole_packets(POW.original, [base, exponent], scope)
    left_to_tensorflow("Pow", base.dtype, "broadcast or unknown shapes")
    return POW.original(x, y, name=name)


def apply(swap: Swap) -> None:
    """Replaces each function above (float32; other dtypes keep theirs)."""
    for op_type, generated in UNARY.items():
        generated.replace(swap, _unary(op_type))
    POW.replace(swap, _pow)
