"""Exact resume with tf_keras's `BackupAndRestore` (part of `keras_backup_and_restore`).

tf_keras's backup is a `tf.train.Checkpoint` of the model (its optimizers
included), the epoch and the batch. What it loses, read from tf_keras's
`callbacks.py`, `distribute/worker_training_state.py`, `engine/training.py`,
`engine/data_adapter.py` and `backend.py`:

- the random layers' state: by default tf_keras's Dropout (and every
  `BaseRandomLayer`) draws from legacy stateful kernels, whose state lives in
  the kernel and in no checkpoint; with `enable_tf_random_generator()` it
  draws from a `tf.random.Generator`, which `BaseRandomLayer` keeps out of
  checkpoints on purpose (`no_automatic_dependency_tracking`);
- the input's position: a resumed epoch trains the epoch's remaining number
  of steps from a fresh iterator, that is the epoch's first batches again;
  and arrays under `shuffle=True` (one stream of per-epoch permutations drawn
  by a stateful op) or a `tf.data` input reshuffled on each `iter()` restart
  at epoch 0's order;
- the epoch's running loss and metrics, for a resume in its middle;
- Python's and NumPy's global generators and TensorFlow's eager op-seed
  generator, for code that draws from them while training.

Under `tfdet.enable()` the tf_keras random layers made afterwards draw from
`tf.random.Generator`s (tf_keras's own switch), and `BackupAndRestore` is a
subclass that writes all of the above into one `tf.train.Checkpoint`
(`BACKUP_SUBDIRECTORY`; `tf.train.CheckpointManager` makes it current in
one atomic step), restores it, and pulls without training the batches the
finished and interrupted epochs took. What is not a variable is written as
a JSON string, never pickled.

A resume in an epoch's middle also gives the compiled loss and metrics
their running values. Not resumable exactly: a `keras.utils.Sequence` or
`DatasetCreator` input (its order is drawn as its iterator runs, outside
any saved state), and one stream for every epoch whose epoch length tf_keras
does not know (a generator without `steps_per_epoch`); tfdet warns at such
a resume.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from typing import Any

from tfdet._errors import ResumeError
from tfdet._resume import _state as _resume_state

# The backup's files, inside `backup_dir` (tf_keras's own go in "chief").
BACKUP_SUBDIRECTORY = "tfdet"
# Version of the JSON string kept in the checkpoint (`_host_state`).
HOST_STATE_FORMAT = 1
# Note on the model: the last `DataHandler` tf_keras made for it (`fit`'s,
# when `on_train_begin` reads it), whose input a resume fast-forwards.
_DATA_HANDLER = "_tfdet_data_handler"
# Note on the model: `fit`'s input and batch size (what a backup's position
# is counted in).
_FIT_ARGUMENTS = "_tfdet_fit_arguments"
# Inputs whose order is drawn while their iterator runs (a Sequence's
# shuffle, a DatasetCreator's function): a resume cannot replay it.
_UNREPLAYABLE_ADAPTERS = {
    "KerasSequenceAdapter": "keras.utils.Sequence input (its order is drawn as it runs)",
    "DatasetCreatorAdapter": "DatasetCreator input (its order is drawn as it runs)",
}


def _random_layers(model: Any) -> Any:
    """`(layer, its tf_keras RandomGenerator)` for each random layer of `model`."""
    from tf_keras.src import backend

    for layer in model._flatten_layers(include_self=True, recursive=True):
        generator = getattr(layer, "_random_generator", None)
        if isinstance(generator, backend.RandomGenerator):
            yield layer, generator


def random_generators(model: Any) -> list[tuple[str, Any]]:
    """`(layer name, tf.random.Generator)` of each random tf_keras layer.

    A layer's generator is made on its first call; it is made here if it was
    not (from the same seed source, in layer order, so an uninterrupted run
    and a resumed one make theirs alike). Layers on legacy stateful kernels
    (made before `enable()`, or in graph mode) have none to save.
    """
    found = []
    for layer, generator in _random_layers(model):
        generator._maybe_init()
        if generator._generator is not None:
            found.append((layer.name, generator._generator))
    return found


def _metric_variables(model: Any) -> list[Any]:
    return [variable for metric in model.metrics for variable in metric.variables]


def _fit_geometry(model: Any, steps_per_epoch: Any) -> dict[str, Any]:
    """`_resume_state.fit_geometry` of the `fit` running `model`."""
    x, batch_size = getattr(model, _FIT_ARGUMENTS, (None, None))
    return _resume_state.fit_geometry(x, batch_size, steps_per_epoch)


def _host_state(model: Any, steps_per_epoch: Any) -> dict[str, Any]:
    return {
        "format": HOST_STATE_FORMAT,
        "metrics": [
            _resume_state.array(variable.numpy())
            for variable in _metric_variables(model)
        ],
        **_resume_state.encode_host_generators(_resume_state.host_generators()),
        "fit": _fit_geometry(model, steps_per_epoch),
    }


def _read_host_state(text: str, source: str) -> dict[str, Any]:
    """The backup's JSON string: metric values, host generators, fit geometry."""
    try:
        data = json.loads(text)
        if data["format"] != HOST_STATE_FORMAT:
            raise ValueError(f"format {data['format']!r}")
        return {
            "metrics": [_resume_state.from_array(value) for value in data["metrics"]],
            **_resume_state.decode_host_generators(data),
            # Absent from older backups: their position is checked against
            # the epoch length only.
            "fit": _resume_state.decode_geometry(data.get("fit")),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise _resume_state.unreadable(source, HOST_STATE_FORMAT, error) from None


def _restore_host_generators(host: dict[str, Any]) -> None:
    """Sets the host's generators as the backup holds them."""
    _resume_state.set_globals((host["python_random"], host["numpy_random"]))
    _resume_state.set_eager_seed(host["eager_seed"])


def _load_metrics(model: Any, data: Any, saved: list[Any]) -> None:
    """Gives `model`'s metrics the saved values (building them if need be).

    A resume in an epoch's middle continues the epoch's running means (the
    loss, the metrics) where the backup left them.
    """
    variables = _metric_variables(model)
    if len(variables) != len(saved):  # Compiled metrics, not built yet.
        unbuildable = _build_compiled_metrics(model, data)
        if unbuildable is not None:
            _say_metrics_start_over(model, unbuildable)
            return
        variables = _metric_variables(model)
    if len(variables) != len(saved):
        _say_metrics_start_over(
            model, f"{len(saved)} values saved, {len(variables)} now"
        )
        return
    for variable, value in zip(variables, saved, strict=True):
        variable.assign(value)


def _build_compiled_metrics(model: Any, data: Any) -> str | None:
    """Builds the compiled loss and metrics; why not, if they cannot be.

    tf_keras builds them in the first traced step, from the structure of
    the labels and outputs: built here from one batch's labels and zeros
    shaped as the outputs (no op of the model runs, nothing is drawn).
    """
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    _, labels, _ = data_adapter.unpack_x_y_sample_weight(data)
    outputs = getattr(model, "_nested_outputs", None)
    if labels is None or outputs is None:
        return "a model without symbolic outputs"
    batch = tf.shape(tf.nest.flatten(labels)[0])[0]
    try:
        predictions = tf.nest.map_structure(
            lambda output: tf.zeros([batch, *output.shape[1:]], output.dtype), outputs
        )
    except (TypeError, ValueError):  # An output dimension known only when run.
        return "outputs of unknown shape"
    model.compiled_loss.build(predictions)
    model.compiled_metrics.build(predictions, labels)
    return None


def _say_metrics_start_over(model: Any, why: str) -> None:
    warnings.warn(
        f"tfdet: the metrics of {model.name}'s resumed epoch start over ({why}): "
        "the epoch's logged means cover the batches trained since the resume; "
        "the weights and each step's training are exact.",
        stacklevel=3,
    )


class _TfKerasExactResume(_resume_state.ExactResume):
    """The methods of tf_keras's exact `BackupAndRestore`.

    A mixin that comes before tf_keras's class (`exact_backup_and_restore_class`
    makes the subclass), so it needs no tf_keras import.
    """

    # tf_keras's own, which the subclass's tf_keras class sets.
    params: dict[str, Any]  # Set by fit before any hook runs.
    save_freq: int | str
    delete_checkpoint: bool
    _training_state: Any  # Its `WorkerTrainingState`, during fit.

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._manager: Any = None
        self._host: Any = None  # The JSON string variable of the backup.

    def on_train_begin(self, logs: Any = None) -> None:
        # Builds the optimizer and tf_keras's training state (epoch and
        # batch variables, restored from tf_keras's own files if any).
        super().on_train_begin(logs)
        latest = self._restore_checkpoint()
        if latest is None:
            return
        model = self.model
        training = self._training_state
        position = {
            "epoch": int(training._ckpt_saved_epoch.numpy()),
            "batch": int(training._ckpt_saved_batch.numpy()),
            "steps trained": int(model._train_counter.numpy()),
        }
        if not self._claim_restore(position):
            # Another BackupAndRestore of this fit restored the host's
            # state and moved the input on; this one agrees with it.
            return
        host = _read_host_state(self._host.numpy().decode(), latest)
        steps = self.params.get("steps")
        # tf_keras resumes after the saved batch, or the saved epoch.
        by_batch = isinstance(self.save_freq, int)
        trained = position["batch"] + 1 if by_batch else 0
        where = (
            f"epoch {position['epoch']}, {trained} steps into it"
            if by_batch
            else f"the end of epoch {position['epoch']}"
        )
        _resume_state.check_same_geometry(
            self.backup_dir, where, host["fit"], _fit_geometry(model, steps)
        )
        _resume_state.check_position_in_epoch(self.backup_dir, trained, steps)
        _restore_host_generators(host)
        self._fast_forward(host["metrics"])

    def _restore_checkpoint(self) -> str | None:
        """Restores the backup's checkpoint into the model and `self._host`.

        Returns:
            The checkpoint's path; None if the backup holds none.
        """
        import tensorflow as tf

        model = self.model
        training = self._training_state
        self._host = tf.Variable("", dtype=tf.string, trainable=False)
        checkpoint = tf.train.Checkpoint(
            model=model,
            ckpt_saved_epoch=training._ckpt_saved_epoch,
            ckpt_saved_batch=training._ckpt_saved_batch,
            train_counter=model._train_counter,
            random_layers=[g.state for _, g in random_generators(model)],
            host=self._host,
        )
        directory = os.path.join(self.backup_dir, BACKUP_SUBDIRECTORY)
        # The manager's pointer to the current checkpoint: TensorFlow
        # ignores one it cannot parse (a fit then trained from step 0 and
        # deleted the backup at its end) or raises a bare ValueError.
        pointer = os.path.join(directory, "checkpoint")
        try:
            self._manager = tf.train.CheckpointManager(
                checkpoint, directory, max_to_keep=1
            )
        except ValueError as error:
            raise _resume_state.damaged(pointer, str(error)) from None
        latest = self._manager.latest_checkpoint
        if latest is None:
            if os.path.exists(pointer):
                raise _resume_state.damaged(
                    pointer, "it names no checkpoint TensorFlow can read"
                )
            return None
        _resume_state.check_owned(self.backup_dir)
        try:
            status = checkpoint.restore(latest)
        except (tf.errors.OpError, IndexError, ValueError) as error:
            # A missing or truncated file of the checkpoint `latest`.
            message = getattr(error, "message", None) or str(error)
            raise _resume_state.damaged(
                f"{latest} (its .index and .data files)", message
            ) from None
        try:
            status.assert_existing_objects_matched()
        except AssertionError as error:
            raise ResumeError(
                f"Expected the backup in {self.backup_dir} to be this "
                f"model's. Received: {str(error).splitlines()[0]} Delete "
                "the backup directory to start over."
            ) from None
        return latest

    def _fast_forward(self, metrics: list[Any]) -> None:
        """Brings the input to the batch the resumed run trains first.

        tf_keras resumes at the epoch and step it computes from the
        checkpoint (asked the same way here) and starts the step count
        there, but draws from the input's start.
        """
        from tf_keras.src.utils.mode_keys import ModeKeys

        model = self.model
        steps = self.params.get("steps")
        epoch, step = self._training_state.maybe_load_initial_counters_from_ckpt(
            steps, 0, mode=ModeKeys.TRAIN
        )
        handler: Any = getattr(model, _DATA_HANDLER, None)
        adapter: Any = None if handler is None else handler._adapter
        unreplayable = _UNREPLAYABLE_ADAPTERS.get(type(adapter).__name__)
        if adapter is None:
            unreplayable = "fit input tfdet did not see made into batches"
        elif not adapter.should_recreate_iterator() and steps is None and epoch:
            unreplayable = "input of unknown length per epoch"
        if unreplayable is not None:
            warnings.warn(
                f"tfdet: a {unreplayable} is not resumable exactly: "
                "where its finished epochs left it is not in the backup. "
                "Give fit a tf.data.Dataset, arrays, or a generator with "
                "steps_per_epoch to resume bit for bit.",
                stacklevel=2,
            )
            return
        pulls = step
        if adapter.should_recreate_iterator():
            # A fresh iterator per epoch (a reshuffling tf.data advances
            # its seed on each): the finished epochs' iterators.
            for _ in range(epoch):
                iter(handler._dataset)
        else:  # One stream for every epoch.
            pulls += epoch * steps
        if pulls:
            # Mid-epoch: the epoch's running means go on from the backup.
            self._pull_before_training(pulls, metrics if step else None)

    def _pull_before_training(self, pulls: int, metrics: Any) -> None:
        """Pulls `pulls` batches from the iterator before the first step.

        With `metrics`, the compiled metrics take those values then
        (after `fit` reset them as the epoch began).
        """
        model = self.model
        original = model.train_function

        def train_function(iterator: Any) -> Any:
            model.train_function = original
            for _ in range(pulls):
                data = next(iterator)  # Trained on before the interruption.
            if metrics is not None:
                _load_metrics(model, data, metrics)
            return original(iterator)

        model.train_function = train_function

    def _backup(self, epoch: int, batch: int = 0) -> None:
        # The epoch and batch variables were set by the batch hooks;
        # `save` writes the checkpoint, then makes it current.
        self._warn_if_kernel_state_random()
        self._host.assign(json.dumps(_host_state(self.model, self.params.get("steps"))))
        self._manager.save()

    def on_train_end(self, logs: Any = None) -> None:
        import tensorflow as tf

        if self.delete_checkpoint:
            directory = os.path.join(self.backup_dir, BACKUP_SUBDIRECTORY)
            if tf.io.gfile.exists(directory):
                tf.io.gfile.rmtree(directory)
        if hasattr(self.model, "_training_state"):
            super().on_train_end(logs)
        else:
            # Another BackupAndRestore of this fit ended first and
            # deleted the model's note, which tf_keras's own method
            # deletes again (an AttributeError with two callbacks).
            if self.delete_checkpoint:
                self._training_state.delete_backup()
            del self._training_state


@functools.cache
def exact_backup_and_restore_class() -> type:
    """The tf_keras `BackupAndRestore` subclass that resumes exactly."""
    from tf_keras.src import callbacks

    return _resume_state.exact_subclass(
        _TfKerasExactResume,
        callbacks.BackupAndRestore,
        "`tf_keras.callbacks.BackupAndRestore` that resumes bit for bit.\n\n"
        "Same arguments as tf_keras's; see the module docstring of "
        "`tfdet._resume._tf_keras`.",
    )


def _record_data_handler(original: Any) -> Any:
    @functools.wraps(original)
    def get_data_handler(*args: Any, **kwargs: Any) -> Any:
        handler = original(*args, **kwargs)
        model = kwargs.get("model")
        if model is not None:
            # Past tf_keras's attribute tracking: a note, not model state.
            object.__setattr__(model, _DATA_HANDLER, handler)
        return handler

    return get_data_handler


# Note on a tf_keras `RandomGenerator`: its generator's state when made.
_FIRST_STATE = "_tfdet_first_state"


def _note_first_state(original: Any) -> Any:
    @functools.wraps(original)
    def _maybe_init(self: Any) -> None:
        original(self)
        generator = self._generator
        if generator is not None and not hasattr(self, _FIRST_STATE):
            setattr(self, _FIRST_STATE, generator.state.numpy().copy())

    return _maybe_init


def _fresh_random_layers(model: Any) -> list[str]:
    """Random layers whose generator has drawn nothing yet (a loaded model's)."""
    import numpy as np

    return [
        layer.name
        for layer, generator in _random_layers(model)
        if (first := getattr(generator, _FIRST_STATE, None)) is not None
        and np.array_equal(generator._generator.state.numpy(), first)
    ]


def _wrap_fit(original: Any) -> Any:
    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        _resume_state.warn_if_resumed_without_state(
            kwargs, lambda: _fresh_random_layers(self)
        )
        object.__setattr__(self, _resume_state.RESTORED_BY, None)
        object.__setattr__(
            self, _FIT_ARGUMENTS, _resume_state.fit_arguments(args, kwargs)
        )
        return original(self, *args, **kwargs)

    return fit


def install(swap: Any) -> None:
    """Random layers on TF generators, and the exact `BackupAndRestore`."""
    import sys

    from tf_keras.src import backend, callbacks
    from tf_keras.src.engine import data_adapter, training

    # What `tf_keras.backend.experimental.enable_tf_random_generator()` sets:
    # the layers made from now on keep their state in a variable.
    swap.attribute(backend, "_USE_GENERATOR_FOR_RNG", True)
    swap.attribute(
        backend.RandomGenerator,
        "_maybe_init",
        _note_first_state(backend.RandomGenerator._maybe_init),
    )
    keras_own = callbacks.BackupAndRestore
    exact = exact_backup_and_restore_class()
    for name in (
        "tf_keras.src.callbacks",
        "tf_keras.callbacks",
        "tf_keras.api._v2.keras.callbacks",
    ):
        module = sys.modules.get(name)
        if getattr(module, "BackupAndRestore", None) is keras_own:
            swap.attribute(module, "BackupAndRestore", exact)
    swap.attribute(
        data_adapter,
        "get_data_handler",
        _record_data_handler(data_adapter.get_data_handler),
    )
    swap.attribute(training.Model, "fit", _wrap_fit(training.Model.fit))
