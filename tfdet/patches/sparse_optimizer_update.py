"""Deterministic tf_keras optimizer updates from `IndexedSlices` gradients.

The gradient of an Embedding (or any `tf.gather`) is an `IndexedSlices`.
tf_keras optimizers apply it with `ResourceScatterAdd`/`Sub`/`Update`, which
TensorFlow runs on the host under op determinism: the variable goes to the
CPU and back every step, and dtypes that cannot be copied with memcpy raise
(tensorflow/tensorflow#52270). Keras 3 optimizers avoid this by densifying
such gradients; this patch does the same for tf_keras: `apply_gradients` of
the tf_keras optimizer base classes (`tf_keras.optimizers.Optimizer` and
`tf_keras.optimizers.legacy.Optimizer`) first turns each `IndexedSlices`
into a dense tensor with `UnsortedSegmentSum` (sort-based and deterministic
on GPU), so the update runs the optimizer's dense path on the device.

When tf_keras is installed but not imported yet (a Keras 3 script, or one
that imports tf_keras after `tfdet.enable()`), `install()` defers the wrap
until tf_keras is imported (the patch's `after_import`), so the patch is in
force whatever the import order, and a script that never imports tf_keras
does not pay for importing it (hundreds of modules).

Tolerance: the dense update is the same arithmetic, but duplicate indices are
summed before the update instead of scattered one after the other, and the
optimizer's dense formula rounds differently from its sparse one; weights
agree to a few float32 ulps per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap

NAME = "sparse_optimizer_update"


def densify(gradient: Any, variable: Any) -> Any:
    """`gradient` as a dense tensor shaped like `variable` (others unchanged).

    Args:
        gradient: A gradient; only `tf.IndexedSlices` are converted.
        variable: The variable it updates (gives the number of rows).
    """
    import tensorflow as tf

    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    with tf.name_scope("DeterministicDensify"):
        rows = tf.shape(variable, out_type=gradient.indices.dtype)[0]
        dense = tf.math.unsorted_segment_sum(gradient.values, gradient.indices, rows)
        dense.set_shape(variable.shape)
        return dense


def densify_all(grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """`(gradient, variable)` pairs with every `IndexedSlices` densified."""
    return [
        (None if gradient is None else densify(gradient, variable), variable)
        for gradient, variable in grads_and_vars
    ]


def _wrap(apply_gradients: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(apply_gradients)
    def apply_dense_gradients(
        self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any
    ) -> Any:
        return apply_gradients(self, densify_all(grads_and_vars), *args, **kwargs)

    apply_dense_gradients.__tfdet_patch__ = NAME  # type: ignore[attr-defined]
    return apply_dense_gradients


def _optimizer_classes() -> list[Any]:
    from tf_keras.src.optimizers import optimizer
    from tf_keras.src.optimizers.legacy import optimizer_v2

    return [optimizer._BaseOptimizer, optimizer.Optimizer, optimizer_v2.OptimizerV2]


def _wrap_optimizers(swap: Swap) -> None:
    for cls in _optimizer_classes():
        # Only classes that define it themselves: a subclass inheriting the
        # method is covered by its base, and wrapping twice is pointless.
        if "apply_gradients" in vars(cls):
            swap.attribute(cls, "apply_gradients", _wrap(vars(cls)["apply_gradients"]))


PATCH = Patch(
    name=NAME,
    replaces=("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate"),
    summary="tf_keras IndexedSlices updates (ResourceScatterAdd) -> UnsortedSegmentSum + dense update",
    upstream="https://github.com/tensorflow/tensorflow/pull/52270",
    after_import=(("tf_keras", _wrap_optimizers),),
    requires={"tf_keras": ">=2.16", "keras_in_use": "tf_keras"},
)
