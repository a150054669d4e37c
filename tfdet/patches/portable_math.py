"""Portable `Exp`, `Log`, `Log1p`, `Expm1`, `Tanh`, `Sigmoid`, `Sin`, `Cos`,
`Pow` and `Softplus` (float32).

TensorFlow computes these with Eigen's packet functions, whose multiply-adds
its x86-64 wheels round twice (built for AVX2, without FMA) and its aarch64
wheels fuse, and whose `tanh` clamps at another bound where it fuses. So
`tf.exp`, `tf.tanh`, `tf.sigmoid` and the softmaxes, losses and recurrent
cells built on them give other bits on an ARM CPU than on an x86 one
(measured under QEMU's aarch64 emulation: every one of them, on 32x64
random inputs). Eigen also computes a tensor's last `size % packet`
elements with another, scalar approximation, so an element's bits follow
its tensor's length.

Here each is tfdet's op `TfdetPortableUnary` or `TfdetPortablePow`
(`tfdet._kernels.portable_math`):
Eigen's own packet algorithm with every multiply-add rounded twice on both
machines, and every element on the packet path. On x86-64 that is what
TensorFlow's kernels compute on whole packets, so the bits there are
TensorFlow's; on aarch64 they are now the same. The gradients are
TensorFlow's registered ones, their TanhGrad and SigmoidGrad in the same
library for the same reason. `Softplus` is TensorFlow's kernel's formula
(x where large, exp(x) where small, else log1p(exp(x))) and its gradient's
(upstream / (exp(-x) + 1)) over these functions.

Installed by "auto" (CPU); other dtypes, and a process where the library
cannot be loaded (said once), keep TensorFlow's ops. Exports trace
TensorFlow's ops (`export_without_kernels`).
Cost: `benchmarks/portable_math.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdet._kernels import portable_math
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

_MATH = "tensorflow.python.ops.gen_math_ops"
# Each op type's generated wrapper, and the kernel's name for the function.
FUNCTIONS = {
    "Exp": (_exact_math.GeneratedOp(_MATH, "exp"), "exp"),
    "Log": (_exact_math.GeneratedOp(_MATH, "log"), "log"),
    "Log1p": (_exact_math.GeneratedOp(_MATH, "log1p"), "log1p"),
    "Expm1": (_exact_math.GeneratedOp(_MATH, "expm1"), "expm1"),
    "Tanh": (_exact_math.GeneratedOp(_MATH, "tanh"), "tanh"),
    "Sigmoid": (_exact_math.GeneratedOp(_MATH, "sigmoid"), "sigmoid"),
    "Sin": (_exact_math.GeneratedOp(_MATH, "sin"), "sin"),
    "Cos": (_exact_math.GeneratedOp(_MATH, "cos"), "cos"),
}
POW = _exact_math.GeneratedOp(_MATH, "_pow")
SOFTPLUS = _exact_math.GeneratedOp("tensorflow.python.ops.gen_nn_ops", "softplus")
# TensorFlow's Softplus kernel's bound: log(float32 epsilon) + 2. Above its
# negation softplus(x) is x, below it exp(x), within an epsilon.
_SOFTPLUS_THRESHOLD = -13.942385152878742


def _replacement(op_type: str) -> Callable[..., Any]:
    generated, function = FUNCTIONS[op_type]

    def replacement(x: Any, name: str | None = None) -> Any:
        import tensorflow as tf

        # TensorFlow's wrapper hands a sparse or ragged input to its
        # dispatcher by the wrapper's own module name, which is this
        # replacement now: applied to their values here, as that does.
        if isinstance(x, tf.SparseTensor):
            return tf.SparseTensor(x.indices, replacement(x.values), x.dense_shape)
        if isinstance(x, tf.RaggedTensor):
            return tf.ragged.map_flat_values(replacement, x)
        library = portable_math.LIBRARY.load()
        tensor = _exact_math.dense_float(x)
        if library is None or tensor is None or tensor.dtype != tf.float32:
            return generated.original(x, name=name)
        with tf.name_scope(name or f"Portable{op_type}"):
            return library.tfdet_portable_unary(tensor, function=function)

    return replacement


def _pow(x: Any, y: Any, name: str | None = None) -> Any:
    """`Pow` of a float32 base and an exponent that is a number or has the
    base's shape, by the kernel; other cases by the op it replaced."""
    import tensorflow as tf

    library = portable_math.LIBRARY.load()
    base = _exact_math.dense_float(x)
    if library is None or base is None or base.dtype != tf.float32:
        return POW.original(x, y, name=name)
    # A Python number takes the base's dtype, as the op's own conversion does.
    exponent = tf.convert_to_tensor(y, dtype_hint=base.dtype)
    if exponent.dtype != tf.float32 or not (
        exponent.shape.rank == 0
        or (base.shape.is_fully_defined() and base.shape == exponent.shape)
    ):
        return POW.original(x, y, name=name)
    with tf.name_scope(name or "PortablePow"):
        return library.tfdet_portable_pow(base, exponent)


def _softplus_forward(x: Any) -> Any:
    import tensorflow as tf

    exp = tf.exp(x)
    small = tf.where(x < _SOFTPLUS_THRESHOLD, exp, tf.math.log1p(exp))
    return tf.where(x > -_SOFTPLUS_THRESHOLD, x, small)


def _softplus_gradient(x: Any, result: Any, upstream: Any) -> Any:
    import tensorflow as tf

    return portable_math.divide(upstream, tf.exp(-x) + 1)


def _softplus(features: Any, name: str | None = None) -> Any:
    """`Softplus` over the portable functions (float32; else the original)."""
    if portable_math.LIBRARY.load() is None:
        return SOFTPLUS.original(features, name=name)
    return _exact_math.portable_op(
        features,
        name,
        "PortableSoftplus",
        SOFTPLUS.original,
        _softplus_forward,
        _softplus_gradient,
        dtypes=("float32",),
    )


def _apply(swap: Any) -> None:
    import tensorflow as tf

    # Loaded now, so the first step does not pay for a build, and a missing
    # compiler is said at enable().
    portable_math.LIBRARY.load()
    # Called from a user's tf.function (`tf.exp` is the replaced wrapper
    # itself), AutoGraph would convert them, and warns that it cannot
    # convert the library's loader: they hold no Python control flow on
    # tensors, so they run as they are.
    plain = tf.autograph.experimental.do_not_convert
    for op_type, (generated, _) in FUNCTIONS.items():
        generated.replace(swap, plain(_replacement(op_type)))
    POW.replace(swap, plain(_pow))
    SOFTPLUS.replace(swap, plain(_softplus))


PATCH = Patch(
    replaces=(*FUNCTIONS, "Pow", "Softplus"),
    summary="Exp, Log, Log1p, Expm1, Tanh, Sigmoid, Sin, Cos, Pow, Softplus "
    "(float32) -> Eigen's packet "
    "algorithms with unfused multiply-adds on every element: TensorFlow's "
    "x86-64 bits, on aarch64 too",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/Eigen/src/Core/arch/Default/GenericPacketMathFunctions.h",
    apply=_apply,
    cpu_only=True,
    kernel=portable_math.LIBRARY,
)
