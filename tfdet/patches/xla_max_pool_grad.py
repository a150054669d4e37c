"""A deterministic MaxPool gradient for XLA-compiled training steps.

XLA lowers TensorFlow's `MaxPoolGrad` to `SelectAndScatter`, which has no
deterministic GPU implementation: under `--xla_gpu_deterministic_ops` the
compile fails, and Keras 3 therefore turns `jit_compile` off whenever op
determinism is on (keras-team/keras#20315). This patch replaces the gradient
registered for `MaxPool` (2-D, NHWC, VALID or SAME padding) when, and only
when, it is built inside an XLA-compiled function: there the gradient is a
sum, in a fixed order, over the window's offsets of the upstream gradient
masked to each window's first maximum and moved to the input grid by
reshapes and pads. Those are element-wise and data-movement ops only, which
XLA compiles deterministically on every device. Outside XLA, and for other
layouts or paddings, TensorFlow's own gradient runs unchanged, so the bits of
a model not compiled with XLA do not change.

Ties: the whole upstream gradient of a window goes to its first maximum in
row-major order, as TensorFlow's CPU kernel does. Where windows overlap, an
input that is the maximum of several windows receives their sum in offset
order rather than in window order: equal to the kernel within rounding.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap

# TensorFlow's MaxPool gradient, for what the patch leaves to it.
_original_gradient: Any = None


def max_pool_grad(
    image: Any,
    pooled: Any,
    grads: Any,
    ksize: list[int],
    strides: list[int],
    padding: str,
) -> Any:
    """Deterministic `tf.raw_ops.MaxPoolGrad` for NHWC, VALID or SAME padding.

    Example:

    >>> import tensorflow as tf
    >>> x = tf.reshape(tf.range(16.0), [1, 4, 4, 1])
    >>> y = tf.nn.max_pool2d(x, 2, 2, "VALID")
    >>> g = max_pool_grad(x, y, tf.ones_like(y), [1, 2, 2, 1], [1, 2, 2, 1], "VALID")
    >>> g[0, :, :, 0].numpy().tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]]

    Args:
        image: The forward op's input, `[batch, height, width, channels]`
            with static height and width.
        pooled: The forward op's output.
        grads: The gradient of `pooled`.
        ksize: `[1, kh, kw, 1]`.
        strides: `[1, sh, sw, 1]`.
        padding: `"VALID"` or `"SAME"`.

    Returns:
        The gradient of `image`, of `grads`' dtype.
    """
    import tensorflow as tf

    _, kh, kw, _ = ksize
    _, sh, sw, _ = strides
    height, width = image.shape[1], image.shape[2]
    out_h, out_w = pooled.shape[1], pooled.shape[2]
    top, bottom = _padding(height, out_h, kh, sh, padding)
    left, right = _padding(width, out_w, kw, sw, padding)
    lowest = tf.constant(float("-inf"), image.dtype)
    padded = tf.pad(
        image, [[0, 0], [top, bottom], [left, right], [0, 0]], constant_values=lowest
    )
    padded_h, padded_w = height + top + bottom, width + left + right
    found = tf.zeros_like(pooled, dtype=tf.bool)
    total: Any = None
    for i in range(kh):
        for j in range(kw):
            window = padded[
                :,
                i : i + (out_h - 1) * sh + 1 : sh,
                j : j + (out_w - 1) * sw + 1 : sw,
                :,
            ]
            first = tf.logical_and(tf.equal(window, pooled), tf.logical_not(found))
            found = tf.logical_or(found, first)
            share = tf.where(first, grads, tf.zeros_like(grads))
            spread = _spread(share, sh, sw)
            placed = tf.pad(
                spread,
                [
                    [0, 0],
                    [i, padded_h - i - spread.shape[1]],
                    [j, padded_w - j - spread.shape[2]],
                    [0, 0],
                ],
            )
            total = placed if total is None else total + placed
    return total[:, top : top + height, left : left + width, :]


def _padding(
    size: int, out: int, kernel: int, stride: int, padding: str
) -> tuple[int, int]:
    """(before, after) padding of one spatial axis, as the forward op pads."""
    if padding == "VALID":  # Windows lie inside the input.
        return 0, 0
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _spread(values: Any, sh: int, sw: int) -> Any:
    """`[b, oh, ow, c]` -> `[b, (oh-1)*sh+1, (ow-1)*sw+1, c]`, zeros between."""
    import tensorflow as tf

    def along(tensor: Any, axis: int, stride: int) -> Any:
        if stride == 1:
            return tensor
        size = tensor.shape[axis]
        zeros = [tf.zeros_like(tensor)] * (stride - 1)
        stacked = tf.stack([tensor, *zeros], axis=axis + 1)
        shape = tf.unstack(tf.shape(tensor))
        shape[axis] = size * stride
        merged = tf.reshape(stacked, tf.stack(shape))
        keep = [slice(None)] * 4
        keep[axis] = slice(0, (size - 1) * stride + 1)
        return merged[tuple(keep)]

    return along(along(values, 1, sh), 2, sw)


def _text(op: Any, name: str) -> str:
    """A string attribute of `op` (graph ops return bytes)."""
    value = op.get_attr(name)
    return value.decode() if isinstance(value, bytes) else value


def _supported(op: Any) -> bool:
    image, pooled = op.inputs[0], op.outputs[0]
    return (
        _text(op, "data_format") == "NHWC"
        and _text(op, "padding") in ("VALID", "SAME")
        and image.shape.rank == 4
        and image.shape[1:3].is_fully_defined()
        and pooled.shape[1:3].is_fully_defined()
    )


def _gradient(op: Any, grad: Any) -> Any:
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    in_xla = control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())
    if not (in_xla and _supported(op)):
        return _original_gradient(op, grad)
    return max_pool_grad(
        op.inputs[0],
        op.outputs[0],
        grad,
        list(op.get_attr("ksize")),
        list(op.get_attr("strides")),
        _text(op, "padding"),
    )


def _apply(swap: Swap) -> None:
    import tensorflow.python.ops.nn_grad  # noqa: F401  (registers the original)

    global _original_gradient
    _original_gradient = swap.gradient("MaxPool", _gradient)


PATCH = Patch(
    replaces=("MaxPoolGrad",),
    summary="MaxPoolGrad inside XLA (SelectAndScatter, no deterministic GPU "
    "lowering) -> first-maximum masks moved by reshapes and pads",
    upstream="https://github.com/keras-team/keras/issues/20315",
    apply=_apply,
)
