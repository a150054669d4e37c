"""Whether a run's Keras models trained with XLA, and why not when asked.

Keras 3 turns `jit_compile=True` off whenever TensorFlow op determinism is
on (`model_supports_jit` in its trainer: not every op has a deterministic
XLA kernel, e.g. MaxPool's gradient), with only "Model doesn't support
`jit_compile=True`" to say so. tfdet's `keras_xla_determinism` patch keeps
an explicit True where a deterministic XLA path exists; where it does not
(a layer without one, or the patches left out), the XLA path of a run would
silently never be checked. `install()` wraps `keras.Model.compile` to notice
that, say it once (`warnings.warn`), and keep the facts for the run's result.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

from tfdet._pin import _environment

NOTICE_START = "tfdet: jit_compile=True was turned off by Keras"
NOTICE = (
    NOTICE_START + " because TensorFlow op "
    "determinism is on and the model has no deterministic XLA path under "
    "tfdet (a MaxPooling3D layer, whose XLA gradient is not deterministic on "
    "GPU, or tfdet's xla_max_pool_grad / keras_xla_determinism patches left "
    "out); the XLA path was not checked. Run `tfdet check --no-enable` to see "
    "whether the XLA model is repeatable, or compile an explicit "
    "`@tf.function(jit_compile=True)` training step."
)

# One entry per `compile` call: {"model", "asked", "effective", "dropped"}.
compiled: list[dict[str, Any]] = []
_noticed = False
_installed = False


def _layers_support_jit(model: Any) -> bool:
    try:
        return all(layer.supports_jit for layer in model._flatten_layers())
    except Exception:  # noqa: BLE001 - a model Keras itself cannot walk
        return True


def effective_jit(model: Any) -> bool | None:
    """The model's resolved `jit_compile` (None: not compiled, or unknown)."""
    # Keras 3 sets `compiled`; tf_keras `_is_compiled`.
    if not (getattr(model, "compiled", False) or getattr(model, "_is_compiled", False)):
        return None
    try:
        return bool(model.jit_compile)
    except Exception:  # noqa: BLE001 - tf_keras models resolve it differently
        return None


def note_compile(model: Any, asked: Any) -> dict[str, Any]:
    """Records one `compile(jit_compile=asked)`; warns once when Keras dropped it."""
    global _noticed
    effective = effective_jit(model)
    dropped = (
        asked is True
        and effective is False
        and _environment.op_determinism_enabled()
        and _layers_support_jit(model)
        and not getattr(model, "run_eagerly", False)
    )
    fact = {
        "model": getattr(model, "name", type(model).__name__),
        "asked": asked if isinstance(asked, bool | str) else repr(asked),
        "effective": effective,
        "dropped_by_determinism": dropped,
    }
    compiled.append(fact)
    if dropped and not _noticed:
        _noticed = True
        warnings.warn(NOTICE, UserWarning, stacklevel=3)
    return fact


def install() -> None:
    """Wraps Keras 3's `compile` (once) to record the XLA facts.

    The wrapper replaces `compile` on the class that defines it (Keras's base
    `Trainer`), not on `keras.Model`: Keras's `compile_from_config`, which
    `keras.models.load_model` calls, compiles a loaded model only when
    `type(model).compile is Trainer.compile`, and a wrapper on `keras.Model`
    made every loaded model look custom-compiled (uncompiled after loading).
    """
    global _installed
    if _installed:
        return
    _installed = True
    import keras

    owner = next(c for c in keras.Model.__mro__ if "compile" in vars(c))
    original = owner.compile
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
        result = original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            asked = bound.arguments.get("jit_compile", "auto")
        except TypeError:
            asked = kwargs.get("jit_compile", "auto")
        note_compile(self, asked)
        return result

    owner.compile = compile


def facts(models: list[Any] | None = None) -> dict[str, Any]:
    """What the result says about XLA: each compile, each model trained.

    Args:
        models: The models that trained, for their resolved `jit_compile`.
    """
    trained = [
        {"model": getattr(m, "name", type(m).__name__), "jit_compile": effective_jit(m)}
        for m in models or []
    ]
    return {
        "compiled": list(compiled),
        "trained": trained,
        "on": any(t["jit_compile"] for t in trained),
        "dropped_by_determinism": any(c["dropped_by_determinism"] for c in compiled),
        "notice": NOTICE
        if any(c["dropped_by_determinism"] for c in compiled)
        else None,
    }
