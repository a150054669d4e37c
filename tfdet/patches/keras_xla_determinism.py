"""Keras 3 keeps XLA under op determinism where it is deterministic.

Keras 3.7 and later answer "does this model support XLA?" with False
whenever TensorFlow op determinism is on (`model_supports_jit`),
because XLA had no deterministic MaxPool gradient (keras-team/keras#20315):
an explicit `compile(jit_compile=True)` then silently trains without XLA,
and `jit_compile="auto"`, which Keras resolves to XLA on a GPU, resolves to
no XLA. With `xla_max_pool_grad` installed, that gradient exists. This patch
asks Keras's question without determinism's veto and keeps XLA when the
answer is yes and no layer of the model builds an op that still has no
deterministic XLA lowering (`MaxPooling3D`: `MaxPool3DGrad`, not covered):

- an explicit `jit_compile=True`, on every device;
- `jit_compile="auto"` (Keras's default) where Keras itself would pick XLA:
  a machine with a GPU, no `tf.distribute` strategy. On a CPU-only machine
  Keras picks no XLA, so a CPU's bits do not change.

Where it does not hold, XLA is off on every Keras: Keras 3.5 and 3.6 have no
veto and would compile a gradient that has no deterministic XLA form.

Under `--xla_gpu_deterministic_ops` a model compiled by XLA repeats its bits
in fresh processes, and runs faster than without XLA (docs/measurements.md,
"GPU step time").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from tfdet._patching._registry import KERAS3, Patch, available
from tfdet._patching._swap import Swap

# Layers whose gradient has no deterministic XLA lowering that tfdet covers.
WITHOUT_DETERMINISTIC_XLA = frozenset({"MaxPooling3D"})
# Layers whose gradient has one once `xla_max_pool_grad` is installed.
NEEDING_MAX_POOL_PATCH = frozenset({"MaxPooling1D", "MaxPooling2D"})


@contextlib.contextmanager
def _without_determinism_veto() -> Iterator[None]:
    """Makes Keras's check read op determinism as off, for one question."""
    from tensorflow.python.framework import config

    original = config.is_op_determinism_enabled
    config.is_op_determinism_enabled = lambda: False
    try:
        yield
    finally:
        config.is_op_determinism_enabled = original


def deterministic_xla_possible(model: Any) -> bool:
    """Whether `model` can train with XLA under op determinism.

    True when Keras, op determinism aside, supports XLA for the model, no
    layer is one of `WITHOUT_DETERMINISTIC_XLA`, and the MaxPool gradient
    patch is installed if a layer is one of `NEEDING_MAX_POOL_PATCH`.
    """
    from keras.src.trainers import trainer

    classes = {type(layer).__name__ for layer in model._flatten_layers()}
    if classes & WITHOUT_DETERMINISTIC_XLA:
        return False
    if (
        classes & NEEDING_MAX_POOL_PATCH
        and not available()["xla_max_pool_grad"].installed
    ):
        return False
    with _without_determinism_veto():
        return bool(trainer.model_supports_jit(model))


def _apply(swap: Swap) -> None:
    from keras.src.trainers import trainer

    keras_property = trainer.Trainer.jit_compile

    def set_jit_compile(self: Any, value: Any) -> None:
        from tensorflow.python.framework import config

        if value is not True or not config.is_op_determinism_enabled():
            keras_property.fset(self, value)
        elif deterministic_xla_possible(self):
            self._jit_compile = True
        else:
            # Keras 3.7+ turns it off itself, with this warning; Keras 3.5
            # and 3.6 kept it, and compiled a gradient without a
            # deterministic XLA form.
            keras_property.fset(self, value)
            if self._jit_compile is True:
                warnings.warn(
                    "Model doesn't support `jit_compile=True`. Proceeding with "
                    "`jit_compile=False`.",
                    stacklevel=2,
                )
                self._jit_compile = False

    swap.attribute(
        trainer.Trainer,
        "jit_compile",
        property(keras_property.fget, set_jit_compile, doc=keras_property.__doc__),
    )
    # Keras 3.15 resolves "auto" in this method; a release without it keeps
    # its own "auto" (no XLA under determinism).
    keras_resolve = getattr(trainer.Trainer, "_resolve_auto_jit_compile", None)
    if keras_resolve is None:
        return

    def resolve_auto_jit_compile(self: Any) -> bool:
        from tensorflow.python.framework import config

        if not config.is_op_determinism_enabled():
            return keras_resolve(self)
        with _without_determinism_veto():
            keras_would = keras_resolve(self)
        return bool(keras_would) and deterministic_xla_possible(self)

    swap.attribute(
        trainer.Trainer, "_resolve_auto_jit_compile", resolve_auto_jit_compile
    )


PATCH = Patch(
    summary="Keras 3 jit_compile=True, and 'auto' on a GPU, under op determinism "
    "(turned off) -> kept where every MaxPool gradient has a deterministic XLA form",
    upstream="https://github.com/keras-team/keras/issues/20315",
    apply=_apply,
    requires=KERAS3,
)
