"""The hooks that record a script's training, installed on Keras and TensorFlow.

- every `Model.fit` call gets a recording `tfdet.DeterminismCallback`
  appended (`_callback_class`): one trace per `fit` call; in a process that
  resumes an interrupted run, it continues the killed process's trace;
- every `Model.train_on_batch` call is recorded after it returns (its logs
  and the weights' fingerprints): one trace per model;
- every eager optimizer update outside those (a custom `GradientTape` loop:
  Keras 3 `Optimizer.apply`, which `apply_gradients` calls; tf_keras
  `apply_gradients`) is recorded with the updated variables' fingerprints:
  one trace per optimizer; one traced inside a `tf.function` only names
  its training, whose final digests are compared;
- every backup the script writes is told to the child protocol (the
  `interrupt` perturbation kills a run only after one).

The hooks record into a `_script_recorder.Recorder`; `install` puts them in
place at once (a run with tfdet), `install_at_first_import` once the script
has imported Keras or TensorFlow (a run without).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from tfdet._child import _keras_calls, _own_copies, _start
from tfdet._child._script_recorder import (
    CUSTOM,
    CUSTOM_COMPILED,
    FIT,
    TRAIN_ON_BATCH,
    Recorder,
)
from tfdet._protocol import _spec

# `(optimizer, args, kwargs)` of an update: the variables it trains.
VariablesOf = Callable[[Any, tuple[Any, ...], dict[str, Any]], list[Any]]


def _logs(model: Any, outputs: Any) -> dict[str, Any]:
    """train_on_batch's return value as a logs dict, whatever the caller asked."""
    if isinstance(outputs, dict):
        return dict(outputs)
    values = outputs if isinstance(outputs, list | tuple) else [outputs]
    names = list(getattr(model, "metrics_names", None) or [])
    if len(names) != len(values):
        names = ["loss", *(f"output_{k}" for k in range(1, len(values)))]
    return dict(zip(names, values, strict=False))


def _updates(model: Any) -> int:
    """The updates all of `model`'s optimizers have applied, summed.

    A batch after which this did not move trained nothing (one an exact
    resume skips). All of them: a GAN's `compile` keeps its two optimizers as
    attributes (keras.io's DCGAN) and leaves `model.optimizer` an unused
    default whose count never moves.
    """
    found = [getattr(model, "optimizer", None), *vars(model).values()]
    optimizers = {
        id(value): value
        for value in found
        if hasattr(value, "iterations") and hasattr(value, "apply_gradients")
    }
    total = 0
    for optimizer in optimizers.values():
        try:
            total += int(optimizer.iterations.numpy())
        except (AttributeError, TypeError, ValueError):
            continue
    return total


def resumed_epoch_start(
    epoch: int, steps_per_epoch: int | None, kept: list[dict[str, Any]]
) -> int:
    """The global step of `epoch`'s first batch, in a fit resumed at `epoch`.

    The run that never stopped numbered its steps on from epoch 0; the
    resumed process must number them the same, or its steps are compared
    with other steps of that run. With the epoch length known, `epoch`
    epochs of it; otherwise from the killed process's trace (`kept`): a
    step it recorded in `epoch`, or the end of the epoch before.

    Args:
        epoch: The epoch the resumed fit starts at (its first
            `on_epoch_begin`).
        steps_per_epoch: `fit`'s steps per epoch, or None if unknown.
        kept: The step records the killed process wrote.
    """
    if steps_per_epoch:
        return epoch * int(steps_per_epoch)
    in_epoch = [s for s in kept if s.get("epoch") == epoch and "batch" in s]
    if in_epoch:
        return int(in_epoch[0]["step"]) - int(in_epoch[0]["batch"])
    before = [int(s["step"]) for s in kept if s.get("epoch") == epoch - 1]
    return max(before) + 1 if before else 0


def _callback_class(recorder: Recorder) -> type:
    """`DeterminismCallback` (its tf_keras flavour when in use) that counts steps.

    In a process that resumes an interrupted run, it continues the killed
    process's trace: steps are numbered from the epoch the script's own
    checkpoint restored, and a batch that trains nothing (one an exact resume
    skips: the optimizer's step count does not move) is not recorded.
    """
    from tfdet._record import _callback, _trace

    base = (
        _callback._tf_keras_class()
        if _callback._tf_keras_in_use()
        else _callback.DeterminismCallback
    )
    resuming = _spec.resumed_after() is not None

    def on_train_begin(self: Any, logs: Any = None) -> None:
        kept: list[dict[str, Any]] = []
        if resuming:
            try:
                kept = _trace.read(self.trace).steps
            except (OSError, ValueError):
                kept = []
        base.on_train_begin(self, logs)
        self._kept_steps = kept
        self._first_epoch = True
        if resuming:
            self._writer.keep(kept)
            self._updates = _updates(self.model)

    def on_epoch_begin(self: Any, epoch: int, logs: Any = None) -> None:
        if resuming and self._first_epoch:
            # The fit starts at the epoch its backup restored (Keras 3 and
            # tf_keras alike): its steps go on with the killed run's numbers.
            self._epoch_start = resumed_epoch_start(
                int(epoch), (self.params or {}).get("steps"), self._kept_steps
            )
        self._first_epoch = False
        base.on_epoch_begin(self, epoch, logs)

    def on_train_batch_end(self: Any, batch: int, logs: Any = None) -> None:
        if resuming:
            done = _updates(self.model)
            if done == self._updates:
                return  # Trained before the interruption, skipped now.
            self._updates = done
        base.on_train_batch_end(self, batch, logs)
        self.steps_recorded_total = self.steps_recorded
        recorder.step_done()

    return type(
        "_RecordingCallback",
        (base,),
        {
            "on_train_begin": on_train_begin,
            "on_epoch_begin": on_epoch_begin,
            "on_train_batch_end": on_train_batch_end,
            "steps_recorded_total": 0,
        },
    )


def _wrap_fit(model_class: Any, recorder: Recorder) -> None:
    original = model_class.fit

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.entry(FIT)
        trace = recorder.new_trace(FIT, f"model {self.name}", lambda: self.weights)
        callback = _callback_class(recorder)(trace=trace.path)
        trace.callback = callback
        fit_args, kwargs = _keras_calls.with_fit_callback(args, kwargs, callback)
        recorder.model_trained(self)
        recorder.depth += 1
        try:
            return original(self, *fit_args, **kwargs)
        finally:
            recorder.depth -= 1
            callback._close()

    model_class.fit = fit


def _wrap_train_on_batch(model_class: Any, recorder: Recorder) -> None:
    original = model_class.train_on_batch

    @functools.wraps(original)
    def train_on_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.entry(TRAIN_ON_BATCH)
        recorder.model_trained(self)
        recorder.depth += 1
        try:
            outputs = original(self, *args, **kwargs)
        finally:
            recorder.depth -= 1
        trace = recorder.trace_for(
            self, TRAIN_ON_BATCH, f"model {self.name}", lambda: self.weights
        )
        trace.record(_logs(self, outputs))
        recorder.step_done()
        return outputs

    model_class.train_on_batch = train_on_batch


def _wrap_optimizer(
    optimizer_class: Any, method: str, recorder: Recorder, variables_of: VariablesOf
) -> None:
    import tensorflow as tf

    original = getattr(optimizer_class, method)

    @functools.wraps(original)
    def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder.depth:  # fit / train_on_batch record their own steps.
            return original(self, *args, **kwargs)
        recorder.depth += 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            recorder.depth -= 1
        variables = variables_of(self, args, kwargs)
        label = f"optimizer {getattr(self, 'name', type(self).__name__)}"
        if not tf.executing_eagerly():
            # Traced inside a tf.function: Python runs once, not per step.
            recorder.entry(CUSTOM_COMPILED)
            recorder.trace_for(self, CUSTOM_COMPILED, label, lambda: variables)
            return result
        recorder.entry(CUSTOM)
        trace = recorder.trace_for(self, CUSTOM, label, lambda: variables)
        trace.record({})
        recorder.step_done()
        return result

    setattr(optimizer_class, method, apply)


def _after_each_call(owner: Any, name: str, then: Callable[[], None]) -> None:
    """Makes `owner.name` call `then()` after each call that returns."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        then()
        return result

    setattr(owner, name, wrapper)


def _note_backups() -> None:
    """Tells the child protocol each time the script writes a backup.

    The `interrupt` perturbation kills a script's run only after one (see
    `_start.note_backup`): Keras 3's BackupAndRestore (tfdet's exact one
    under enable(), Keras's own without) and every `tf.train.Checkpoint`
    save or write, `CheckpointManager.save` included (all go through
    `Checkpoint._write`).
    """
    import keras
    import tensorflow as tf

    _after_each_call(
        keras.callbacks.BackupAndRestore, "_save_model", _start.note_backup
    )
    _after_each_call(tf.train.Checkpoint, "_write", _start.note_backup)


def install_at_first_import(recorder: Recorder) -> None:
    """Installs the hooks once the script has imported Keras or TensorFlow.

    A run without tfdet leaves the script's own settings first: what it sets
    before `import tensorflow` (TF_ENABLE_ONEDNN_OPTS, its own
    `tfdet.enable()`, which pins oneDNN) is read at that import, so
    importing TensorFlow here, before the script, would make the script's
    `enable()` too late on a CPU where TensorFlow turns oneDNN off by itself.
    A script that imports `keras` or `tf_keras` first imports TensorFlow
    inside it: the hooks, which need that Keras, wait for it to be whole.
    """
    from tfdet._patching import _import_hook

    installed = False

    def once() -> None:
        nonlocal installed
        if not installed:
            installed = True
            install(recorder)

    def importing(name: str) -> bool:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        return getattr(spec, "_initializing", False)

    def after_tensorflow() -> None:
        if importing("keras") or importing("tf_keras"):
            return  # That Keras's own hook installs them once it is whole.
        once()

    for keras in ("keras", "tf_keras"):
        _import_hook.when_imported(keras, once)
    _import_hook.when_imported("tensorflow", after_tensorflow)


def install(recorder: Recorder) -> None:
    """Installs the hooks on Keras 3, and on tf_keras when it is in use."""
    import keras

    from tfdet._pin import _versions

    _note_backups()
    _own_copies.own_training_state()
    _wrap_fit(keras.Model, recorder)
    _wrap_train_on_batch(keras.Model, recorder)
    _wrap_optimizer(
        keras.optimizers.Optimizer, "apply", recorder, _keras_calls.keras3_variables
    )
    if _versions.uses_legacy_keras():
        import tf_keras

        _wrap_fit(tf_keras.Model, recorder)
        _wrap_train_on_batch(tf_keras.Model, recorder)
        _wrap_optimizer(
            tf_keras.optimizers.Optimizer,
            "apply_gradients",
            recorder,
            _keras_calls.tf_keras_variables,
        )
