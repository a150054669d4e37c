"""Exports trace TensorFlow's own ops, never tfdet's kernels.

`tfdet.enable()` computes products, convolutions and the exact GELU's erfc
with ops of tfdet's own (`fixed_order_products`, `fixed_order_convolutions`,
`portable_kernels`). A SavedModel that held them would load only where
tfdet's library does ("Op type not registered 'TfdetFixedOrderMatMul'"
elsewhere). While Keras's `Model.export`, `keras.export.ExportArchive`, or
TensorFlow's `tf.saved_model.save` (and tf_keras's `model.save`, which
calls it) traces and writes, this patch takes the kernels out of reach
(`tfdet._kernels.library.exporting`), so each patch traces its composition
of TensorFlow's ops: the SavedModel loads and serves in any process with
TensorFlow, without tfdet. Its bits are then those of the compositions as
the serving process's TensorFlow computes them (oneDNN's choices, its pool
size), not the kernels'; the erfc's composition has the kernel's bits.

To serve the kernels' bits, load the model where tfdet is enabled: a
`.keras` file (`model.save("model.keras")`, then `tfdet.enable()` and
`keras.models.load_model`) holds weights and configuration, no ops, so its
calls run the kernels again. A `tf.function` a program traced itself
before saving it may still hold the kernels (an export does not trace it
again).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from tfdet._kernels import fixed_order, portable
from tfdet._kernels.library import exporting
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch

# TensorFlow's SavedModel writers (`tf.saved_model.save` calls the second;
# tf_keras's `model.save` calls it directly).
_SAVED_MODEL = "tensorflow.python.saved_model.save"
_SAVERS = ("save", "save_and_return_nodes")
# Keras 3's `ExportArchive` traces its endpoints as they are added, before
# it writes them.
_ARCHIVE_METHODS = ("add_endpoint", "track_and_add_endpoint", "write_out")


def _without_kernels(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, during which the compositions are traced, not the kernels."""

    @functools.wraps(function)
    def without_kernels(*args: Any, **kwargs: Any) -> Any:
        with exporting():
            return function(*args, **kwargs)

    return without_kernels


def _apply(swap: Any) -> None:
    for name in _SAVERS:
        original = getattr(sys.modules[_SAVED_MODEL], name)
        _exact_math.swap_everywhere(
            swap, _SAVED_MODEL, name, _without_kernels(original)
        )


def _apply_to_keras(swap: Any) -> None:
    import keras

    swap.attribute(keras.Model, "export", _without_kernels(keras.Model.export))
    archive = getattr(getattr(keras, "export", None), "ExportArchive", None)
    for name in _ARCHIVE_METHODS:
        if archive is not None and hasattr(archive, name):
            swap.attribute(archive, name, _without_kernels(getattr(archive, name)))


def _no_kernels() -> str | None:
    """Why no export here could hold a kernel of tfdet's, or None."""
    if fixed_order.LIBRARY.within_reach() or portable.LIBRARY.within_reach():
        return None
    return "tfdet's kernels are neither shipped for this TensorFlow nor buildable here"


PATCH = Patch(
    summary="Model.export, ExportArchive, tf.saved_model.save -> traced with "
    "tfdet's kernels out of reach (compositions of TensorFlow's ops), so the "
    "SavedModel loads without tfdet",
    upstream="https://www.tensorflow.org/guide/create_op#use_the_op_in_python",
    apply=_apply,
    after_import=(("keras", _apply_to_keras),),
    unavailable=_no_kernels,
)
