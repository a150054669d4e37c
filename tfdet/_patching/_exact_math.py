"""Shared parts of the patches that keep approximate CPU instructions out.

Eigen, which TensorFlow's CPU kernels use, computes `1/sqrt(x)` and `1/x` for
float32 with the x86 approximate instructions RSQRTPS / RCPPS refined by one
Newton step (`prsqrt`, `preciprocal` under `EIGEN_FAST_MATH`). Their results
are implementation-specific: an Intel and an AMD CPU (and QEMU) give other
last bits, so the same program trains to other weights on another CPU model
even with one thread and a pinned ISA. The ops whose kernels use them (Rsqrt,
Reciprocal/Inv, Softmax's `sum.inverse()`, Erfc's `1/x^2`) are replaced by
compositions of IEEE-754 correctly rounded operations (sqrt, division, and
the element-wise ops whose bits were measured equal across CPU models), whose
results are the same on every CPU.

Grappler brings the approximate kernels back inside a `tf.function` if it
can: it rewrites `Div(x, Sqrt(y))` (and `Xdivy`) into a multiplication by
`Rsqrt(y)`, and once a static shape lets it fold `OnesLike` into a constant,
`Div(1, y)` into `Reciprocal(y)`. The compositions
therefore divide with `tfdet._kernels.portable_math.divide`, whose numerator
Grappler cannot fold, by a divisor it cannot see through (`opaque()`). Each replacement keeps the original op's gradient formula
(through `tf.custom_gradient`), whose kernels use multiplications only.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

from tfdet._patching._swap import Swap

# Float dtypes the compositions handle; any other dtype (integers, complex)
# goes to the original op, whose kernels use no approximate instruction.
FLOATS = ("bfloat16", "float16", "float32", "float64")


# The wrappers as TensorFlow defined them, by (module, function), recorded
# by the first patch that replaced each: where one patch's replacement calls
# another's composition (fixed_order_convolutions falls back to
# pool_size_free_products' for what its kernel cannot take), that
# composition reaches TensorFlow's wrapper whether or not its own patch is
# installed.
_TENSORFLOWS: dict[tuple[str, str], Callable[..., Any]] = {}


class GeneratedOp:
    """A generated op wrapper (`gen_math_ops.rsqrt`) that a patch replaces.

    Attributes:
        original: The wrapper this patch's `replace` found bound (another
            patch's replacement where one came first), or, before it ran,
            TensorFlow's own where any patch replaced it; the replacement
            calls it for the inputs it leaves alone. None before any did.
    """

    def __init__(self, module: str, function: str) -> None:
        self._key = (module, function)
        self._found: Callable[..., Any] | None = None

    # Any, not `Callable[..., Any] | None`: TensorFlow's untyped generated
    # wrapper (or a patch's replacement), None only before any patch's
    # `replace` ran; the replacements that call it run after theirs did.
    @property
    def original(self) -> Any:
        return self._found or _TENSORFLOWS.get(self._key)

    @property
    def tensorflows(self) -> Any:
        """TensorFlow's own wrapper (None before any patch replaced it): for
        inputs that TensorFlow's op itself must take, empty ones and ones it
        refuses with its own error, past any other patch's replacement."""
        return _TENSORFLOWS.get(self._key)

    def replace(self, swap: Swap, replacement: Callable[..., Any]) -> None:
        """Binds `replacement` wherever TensorFlow binds the wrapper."""
        self._found = swap_everywhere(swap, *self._key, replacement)
        _TENSORFLOWS.setdefault(self._key, self._found)


def swap_everywhere(
    swap: Swap, module: str, function: str, replacement: Callable[..., Any]
) -> Callable[..., Any]:
    """Replaces every binding of a generated op wrapper in TensorFlow.

    Some generated wrappers are bound under other names than their
    `gen_*_ops` module (`tf.math.reciprocal` is `gen_math_ops.reciprocal`
    itself; `math_ops.erfc` is a second copy of `gen_math_ops.erfc`), so each
    attribute of a loaded `tensorflow` module holding a function defined as
    `module.function` is replaced.

    Two patches of one wrapper stack: the later one finds the earlier one's
    replacement where the wrapper was (by identity) and calls it as its
    original.

    Returns:
        The original `module.function` (or an earlier patch's replacement),
        which the replacement calls for the dtypes and inputs it leaves alone.
    """
    original = getattr(sys.modules[module], function)
    # The bindings are found first and replaced after; each candidate is
    # read again now, so a binding an earlier swap changed is seen as it is.
    # An earlier patch's replacement, where one was bound, is found under
    # the wrapper's module and under its own.
    modules = dict.fromkeys((module, getattr(original, "__module__", module)))
    candidates = dict.fromkeys(
        pair for defined_in in modules for pair in _BINDINGS.defined_in(defined_in)
    )
    bound = []
    for loaded, attribute in candidates:
        value = vars(loaded).get(attribute)
        if value is original or (
            callable(value)
            and getattr(value, "__module__", None) == module
            and getattr(value, "__name__", None) == function
        ):
            bound.append((loaded, attribute))
    for loaded, attribute in bound:
        swap.attribute(loaded, attribute, replacement)
    return original


class _Bindings:
    """Where TensorFlow's modules bind callables, by the module defining them.

    Walking every attribute of every loaded `tensorflow` module took about
    0.1 s of CPU, and `enable()` replaced up to 27 wrappers, each with its
    own walk (0.64 s of a fresh process's `enable()` for the default six, on
    a 2-core EPYC Zen 3). Each module is walked once instead, when first
    asked about after it loaded; a binding is listed under the `__module__`
    its value had then. Only `__module__` is read while walking, as the walk
    per wrapper did: an object that answers other attributes itself (absl's
    `FLAGS` parses the command line when asked for `__name__`) is left alone.
    """

    def __init__(self) -> None:
        self._walked: set[str] = set()
        self._by_module: dict[str, list[tuple[Any, str]]] = {}

    def defined_in(self, module: str) -> list[tuple[Any, str]]:
        """(module, attribute) pairs whose callable value `module` defined."""
        new = [
            name
            for name in sys.modules
            if (name == "tensorflow" or name.startswith("tensorflow."))
            and name not in self._walked
        ]
        if new:
            self._walk(sorted(new))
        return self._by_module.get(module, [])

    def _walk(self, names: list[str]) -> None:
        # The garbage collector paused: in a process holding TensorFlow, a
        # walk that allocates per attribute sets off its full passes (about
        # 0.3 s each).
        paused = gc.isenabled()
        gc.disable()
        try:
            for name in names:
                self._walked.add(name)
                loaded = sys.modules.get(name)
                if loaded is None:
                    continue
                namespace = vars(loaded)
                for attribute in tuple(namespace):
                    value = namespace.get(attribute)
                    if callable(value):
                        key = getattr(value, "__module__", None)
                        if isinstance(key, str):
                            self._by_module.setdefault(key, []).append(
                                (loaded, attribute)
                            )
        finally:
            if paused:
                gc.enable()


_BINDINGS = _Bindings()


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Logs `message` on tfdet's logger the first time this process gives it."""
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("tfdet").warning(message)


# (op type, what the patch could not take) of each input left to TensorFlow.
_LEFT: set[tuple[str, str]] = set()


def left_ops() -> tuple[tuple[str, str], ...]:
    """`(op type, dtype or reason)` of every input a patch of this process
    left to TensorFlow's op with its promise lost (`left_to_tensorflow`),
    sorted."""
    return tuple(sorted(_LEFT))


def left_to_tensorflow(
    patch: str, op_type: str, dtype: Any, reason: str | None
) -> None:
    """Says once when a patch leaves an input to TensorFlow's op, losing its promise.

    Integer products are exact and an empty product has nothing to sum, so
    only floating-point dtypes the patch does not compute, or `reason` (what
    its replacement cannot take), lose it.
    """
    if reason is None and (not dtype.is_floating or dtype.name == "float32"):
        return
    _LEFT.add((op_type, reason or dtype.name))
    warn_once(
        f"tfdet: {patch} leaves {op_type} on {reason or dtype.name} to "
        "TensorFlow's own op, whose bits may follow the thread-pool size and "
        "the batch."
    )


def call_convolution(
    original: Callable[..., Any],
    inputs: tuple[Any, ...],
    strides: Any,
    padding: Any,
    use_cudnn_on_gpu: bool,
    explicit_paddings: Any,
    data_format: Any,
    dilations: Any,
    name: str | None,
) -> Any:
    """Calls a generated 2-D convolution wrapper (`conv2d`, `conv2d_backprop_*`).

    For the replacements of those wrappers, which share their signature: the
    inputs they leave to TensorFlow go to `original` as they came.
    """
    return original(
        *inputs,
        strides,
        padding,
        use_cudnn_on_gpu=use_cudnn_on_gpu,
        explicit_paddings=list(explicit_paddings),
        data_format=data_format,
        dilations=list(dilations),
        name=name,
    )


def static_shape(sizes: Any) -> Any:
    """The static `tf.TensorShape` that a sizes tensor (4 numbers) holds.

    The registered gradients pass `shape_n([input, filter])[i]`, which has
    no static value in a graph; its input has a static shape. Keras 3's
    `Conv2DTranspose` passes a list whose batch is a tensor of a graph
    (`[tf.shape(x)[0], 16, 16, 4]` when traced with an unknown batch): that
    number is unknown, the others are kept.
    """
    import tensorflow as tf

    value = tf.get_static_value(sizes, partial=True)
    if value is not None:
        return tf.TensorShape([_static_number(size) for size in value])
    op = getattr(sizes, "op", None)
    if op is not None and op.type in ("Shape", "ShapeN"):
        return op.inputs[sizes.value_index].shape
    return tf.TensorShape([None] * 4)


def _static_number(size: Any) -> int | None:
    """One number of a sizes tensor or list as an int, or None if not known."""
    import tensorflow as tf

    if tf.is_tensor(size):
        size = tf.get_static_value(size)
    return None if size is None else int(size)


def attribute_text(attribute: Any, default: str) -> str:
    """A string attribute as the registered gradients pass it (bytes, or None)."""
    if isinstance(attribute, bytes):
        return attribute.decode()
    return attribute or default


def portable_op(
    x: Any,
    name: str | None,
    scope: str,
    original: Callable[..., Any],
    forward: Callable[[Any], Any],
    gradient: Callable[[Any, Any, Any], Any],
    dtypes: tuple[str, ...] = FLOATS,
) -> Any:
    """Runs a portable replacement of a one-input op, with its gradient.

    Args:
        x: The op's input.
        name: The caller's name scope, or None for `scope`.
        scope: The default name scope.
        original: The original op wrapper, for inputs the replacement leaves
            alone (not a dense tensor of one of `dtypes`).
        forward: `value -> result`, from correctly rounded operations.
        gradient: `(value, result, upstream) -> input gradient`: the original
            op's registered formula, so that only the forward changes.
        dtypes: The dtypes computed here.
    """
    import tensorflow as tf

    tensor = dense_float(x)
    if tensor is None or tensor.dtype.name not in dtypes:
        return original(x, name=name)

    @tf.custom_gradient
    def run(value: Any) -> Any:
        result = forward(value)
        return result, lambda upstream: gradient(value, result, upstream)

    with tf.name_scope(name or scope):
        return run(tensor)


def dense_float(x: Any) -> Any:
    """`x` as a dense float tensor, or None when the original op should run."""
    import tensorflow as tf

    if isinstance(x, (tf.RaggedTensor, tf.SparseTensor, tf.IndexedSlices)):
        return None
    tensor = tf.convert_to_tensor(x)
    return tensor if tensor.dtype.name in FLOATS else None


def opaque(x: Any) -> Any:
    """`x` through `Snapshot`, which hides a `Sqrt` from Grappler's rewrite."""
    from tensorflow.python.ops import gen_array_ops

    return gen_array_ops.snapshot(x)
