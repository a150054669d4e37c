"""Deterministic, on-device scatter behind confusion matrices (IoU metrics).

Under op determinism TensorFlow runs `ScatterNd` on the host: the tensor goes
to the CPU and back (tensorflow/tensorflow#52270). The IoU metrics reach it
through their confusion matrix: Keras 3's `metrics_utils.confusion_matrix`
calls `ops.scatter`, and `tf.math.confusion_matrix` (used by tf_keras'
metrics) calls `array_ops.scatter_nd`. This patch gives exactly those two
functions a `scatter_nd` built from `UnsortedSegmentSum` (sort-based and
deterministic on GPU) by replacing the module they look the scatter up in
with a view whose scatter is the deterministic one. Everything else they do
(validation, casts) stays TensorFlow's and Keras' own code; other callers of
`tf.scatter_nd` are unaffected.

Out-of-range indices raise `InvalidArgumentError`, as the CPU `ScatterNd`
kernel does; the check is an `Assert` whose one boolean goes to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def scatter_nd(indices: Any, updates: Any, shape: Any, name: str | None = None) -> Any:
    """Deterministic `tf.scatter_nd`: sums `updates` into zeros of `shape`.

    Example:

    >>> scatter_nd([[0], [2], [0]], [1, 2, 3], [4]).numpy().tolist()
    [4, 0, 2, 0]

    Args:
        indices: Integer tensor `[..., K]` of indices into the first K axes.
        updates: Tensor `indices.shape[:-1] + shape[K:]`; duplicates add up.
        shape: Shape of the result (a 1-D integer tensor or list).
        name: Name scope.

    Raises:
        InvalidArgumentError: an index is outside `shape`.
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicScatterNd"):
        indices = tf.convert_to_tensor(indices)
        updates = tf.convert_to_tensor(updates)
        shape = tf.cast(tf.convert_to_tensor(shape), indices.dtype)
        depth = indices.shape[-1]
        if depth is None:
            raise ValueError(
                "Expected the last axis of `indices` to have a static size. "
                f"Received: indices.shape={indices.shape}"
            )
        outer = shape[:depth]
        in_range = tf.reduce_all((indices >= 0) & (indices < outer))
        check = tf.debugging.Assert(
            in_range,
            ["indices do not index into shape", shape],
            name="indices_in_range",
        )
        # Row-major strides of the first `depth` axes: index -> flat position.
        strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
        with tf.control_dependencies([check]):
            flat = tf.reduce_sum(indices * strides, axis=-1)
        total = tf.reduce_prod(outer)
        summed = tf.math.unsorted_segment_sum(updates, flat, total)
        return tf.reshape(summed, shape)


class _ModuleView:
    """A module whose attribute `name` is `replacement`; the rest delegate."""

    def __init__(self, module: Any, name: str, replacement: Callable[..., Any]) -> None:
        self._module = module
        self._name = name
        self._replacement = replacement

    def __getattr__(self, attr: str) -> Any:
        if attr == self._name:
            return self._replacement
        return getattr(self._module, attr)


def _keras_scatter(indices: Any, values: Any, shape: Any) -> Any:
    return scatter_nd(indices, values, shape)


def _keras3_uses_tensorflow() -> bool:
    try:
        import keras
    except ImportError:
        return False
    return keras.config.backend() == "tensorflow"


def _apply(swap: Swap) -> None:
    """Points both confusion matrices at the deterministic scatter."""
    from tensorflow.python.ops import confusion_matrix

    swap.attribute(
        confusion_matrix,
        "array_ops",
        _ModuleView(confusion_matrix.array_ops, "scatter_nd", scatter_nd),
    )
    if _keras3_uses_tensorflow():
        from keras.src.metrics import metrics_utils

        swap.attribute(
            metrics_utils,
            "ops",
            _ModuleView(metrics_utils.ops, "scatter", _keras_scatter),
        )


PATCH = Patch(
    replaces=("ScatterNd",),
    summary="ScatterNd in confusion matrices (IoU metrics) -> UnsortedSegmentSum",
    upstream="https://github.com/tensorflow/tensorflow/pull/52270",
    apply=_apply,
)
