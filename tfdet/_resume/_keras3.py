"""Keras 3's half of the `keras_backup_and_restore` patch: the exact
`BackupAndRestore` subclass, the `fit` it watches, and `random_state`.

What Keras 3's own backup loses, and what this one saves instead, is the
patch's docstring (`tfdet.patches.keras_backup_and_restore`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import sys
import warnings
from typing import Any

from tfdet._errors import ResumeError
from tfdet._resume import _state as _resume_state

# The file that names the current generation, and each generation's files.
CURRENT = "tfdet_current"
_WEIGHTS = "tfdet-{n}.weights.h5"
_STATE = "tfdet-{n}.state.json"
# Version of the state file's layout (`_encode_state`).
STATE_FORMAT = 1
# Notes on the model for one `fit` (besides `_resume_state.RESTORED_BY`): the
# input `fit` was given, which a resume fast-forwards, and its
# `steps_per_epoch` (given: one iterator serves every epoch).
_FIT_INPUT = "_tfdet_fit_input"
_FIT_STEPS_PER_EPOCH = "_tfdet_fit_steps_per_epoch"
# ... and its `batch_size` (what a backup's position is counted in).
_FIT_BATCH_SIZE = "_tfdet_fit_batch_size"
# ... and the callbacks skipping trained batches (`_skip_trained_batches`).
_SKIPPING = "_tfdet_skipping"
# Iterators Keras 3's TF `fit` makes of a `tf.data` input per epoch (one at
# the epoch's start, one made at its end and dropped), when `steps_per_epoch`
# is None and the cardinality is known; one otherwise.
ITERATORS_PER_EPOCH = 2


def seed_generators(model: Any) -> list[tuple[str, Any]]:
    """`(name, SeedGenerator)` of every layer of `model`, in layer order."""
    found = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for index, generator in enumerate(getattr(layer, "_seed_generators", [])):
            found.append((f"{layer.name}#{index}", generator))
    return found


def _global_seed_generator(create: bool = False) -> Any:
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    if create:
        return seed_generator.global_seed_generator()
    # Keras 3.15 names the attribute in a constant; 3.12 and older wrote the
    # same string inline.
    name = getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator")
    return global_state.get_global_attribute(name)


def random_state(model: Any) -> Any:
    """The random state of `model` that a `tf.train.Checkpoint` does not save.

    Keras 3 keeps each layer's `SeedGenerator` (Dropout's masks, random
    augmentation layers) out of a model's checkpoint, and tf_keras each
    random layer's `tf.random.Generator` (its random layers draw from one
    under `tfdet.enable()`), so a custom training loop resumed from
    `tf.train.Checkpoint(model=..., optimizer=...)` draws the masks of its
    first steps again. Add this to the checkpoint:

    >>> checkpoint = tf.train.Checkpoint(                       # doctest: +SKIP
    ...     model=model, optimizer=optimizer, iterator=iterator,
    ...     random=tfdet.random_state(model))

    Randomness inside a `tf.data` map must come from the pipeline itself
    (`Dataset.random` seeds fed to stateless ops): a stateful random op
    cannot be saved with the iterator.

    Args:
        model: A built Keras 3 or tf_keras model.

    Returns:
        A `tf.Module` tracking each layer's seed state (and Keras 3's global
        one).
    """
    import tensorflow as tf

    holder = tf.Module()
    if _is_tf_keras(model):
        from tfdet._resume import _tf_keras

        generators = _tf_keras.random_generators(model)
        holder.layer_seeds = [generator.state for _, generator in generators]
        return holder
    holder.layer_seeds = [generator.state for _, generator in seed_generators(model)]
    holder.global_seed = _global_seed_generator(create=True).state
    return holder


def _is_tf_keras(model: Any) -> bool:
    tf_keras = sys.modules.get("tf_keras")
    return tf_keras is not None and isinstance(model, tf_keras.Model)


def _encode_state(state: dict[str, Any]) -> dict[str, Any]:
    """The resume state as JSON values (Python floats keep every bit)."""
    return {
        "format": STATE_FORMAT,
        "epoch": state["epoch"],
        "steps_done": state["steps_done"],
        "iterations": state["iterations"],
        "seeds": [
            [name_, _resume_state.array(value)] for name_, value in state["seeds"]
        ],
        "global_seed": None
        if state["global_seed"] is None
        else _resume_state.array(state["global_seed"]),
        "metrics": [_resume_state.array(value) for value in state["metrics"]],
        **_resume_state.encode_host_generators(state),
        "counters": list(state["counters"]),
        "epoch_random": _encode_globals(state["epoch_random"]),
        "fit": state["fit"],
    }


def _encode_globals(pair: Any) -> Any:
    """`(random.getstate(), np.random.get_state())` as JSON, or None."""
    if pair is None:
        return None
    python, numpy_state = pair
    return [
        _resume_state.python_random(python),
        _resume_state.numpy_random(numpy_state),
    ]


def _decode_globals(data: Any) -> Any:
    """Inverse of `_encode_globals`."""
    if data is None:
        return None
    python, numpy_state = data
    return _resume_state.from_python_random(python), _resume_state.from_numpy_random(
        numpy_state
    )


def _decode_state(data: Any, path: str) -> dict[str, Any]:
    """Inverse of `_encode_state`; a clear error for anything else."""
    try:
        if data["format"] != STATE_FORMAT:
            raise ValueError(f"format {data['format']!r}")
        return {
            "epoch": int(data["epoch"]),
            "steps_done": int(data["steps_done"]),
            "iterations": int(data["iterations"]),
            "seeds": [
                (str(name_), _resume_state.from_array(value))
                for name_, value in data["seeds"]
            ],
            "global_seed": None
            if data["global_seed"] is None
            else _resume_state.from_array(data["global_seed"]),
            "metrics": [_resume_state.from_array(value) for value in data["metrics"]],
            **_resume_state.decode_host_generators(data),
            "counters": tuple(int(count) for count in data["counters"]),
            # Absent from the backups of tfdet 0.x before it: a mid-epoch
            # resume from one replays the epoch's start draws as before.
            "epoch_random": _decode_globals(data.get("epoch_random")),
            # Absent from older backups too: their position is checked
            # against the epoch length only.
            "fit": _resume_state.decode_geometry(data.get("fit")),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise _resume_state.unreadable(path, STATE_FORMAT, error) from None


class _Keras3ExactResume(_resume_state.ExactResume):
    """The methods of Keras 3's exact `BackupAndRestore`.

    A mixin that comes before Keras's class (`exact_backup_and_restore_class`
    makes the subclass), so it needs no Keras import.
    """

    params: dict[str, Any] | None  # Keras's: None until fit sets them.

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._steps_done = 0  # Batches trained in the current epoch.
        self._to_skip = 0  # Batches to pull without training (resume).
        self._skipping = False
        self._saved_metrics: list[Any] | None = None
        # Python's and NumPy's global generators as the epoch began.
        self._epoch_random: Any = None
        # At a mid-epoch resume: the generators' state at the backup,
        # set once the skipped batches are pulled.
        self._random_after_skip: Any = None
        # At a resume under `steps_per_epoch`: the finished epochs'
        # batches, pulled from the fresh iterator before anything else.
        self._stream_skip = 0

    # -- saving ---------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        model = self.model
        glob = _global_seed_generator()
        return {
            "epoch": self._current_epoch,
            "steps_done": self._steps_done,
            "iterations": int(model.optimizer.iterations.numpy()),
            "seeds": [
                (name, generator.state.numpy())
                for name, generator in seed_generators(model)
            ],
            "global_seed": None if glob is None else glob.state.numpy(),
            "metrics": [v.numpy() for v in model.metrics_variables],
            **_resume_state.host_generators(),
            "counters": (
                self._batches_seen_since_last_saving,
                self._last_batch_seen,
            ),
            "epoch_random": self._epoch_random,
            "fit": self._fit_geometry(),
        }

    def _fit_geometry(self) -> dict[str, Any]:
        model = self.model
        return _resume_state.fit_geometry(
            getattr(model, _FIT_INPUT, None),
            getattr(model, _FIT_BATCH_SIZE, None),
            (self.params or {}).get("steps"),
        )

    def _save_model(self) -> None:
        self._warn_if_kernel_state_random()
        os.makedirs(self.backup_dir, exist_ok=True)
        current = _current(self.backup_dir)
        generation = 0 if current is None else current + 1
        path = os.path.join(self.backup_dir, _STATE.format(n=generation))
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump(_encode_state(self._state()), out)
        os.replace(path + ".tmp", path)
        self.model.save_weights(
            os.path.join(self.backup_dir, _WEIGHTS.format(n=generation)),
            overwrite=True,
        )
        # The one commit point: a kill before it leaves `current` whole.
        pointer = os.path.join(self.backup_dir, CURRENT)
        with open(pointer + ".tmp", "w", encoding="utf-8") as out:
            out.write(str(generation))
        os.replace(pointer + ".tmp", pointer)
        if current is not None:  # Kept until the new one was current.
            for name in (_WEIGHTS, _STATE):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.backup_dir, name.format(n=current)))

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        import numpy as np

        if not self._to_skip:
            self._steps_done = 0
        # Before the epoch's iterator starts (and draws its order).
        self._epoch_random = (random.getstate(), np.random.get_state())

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._skipping = self._to_skip > 0
        if not self._skipping and self._random_after_skip is not None:
            # The skipped batches are pulled (the epoch's order drawn
            # again): on from where the interrupted run saved.
            _resume_state.set_globals(self._random_after_skip)
            self._random_after_skip = None

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._skipping:
            return  # Pulled, not trained: nothing to count or save.
        self._steps_done = batch + 1
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._steps_done = 0
        super().on_epoch_end(epoch, logs)

    # -- restoring ------------------------------------------------------

    def _load_model(self) -> None:
        generation = _current(self.backup_dir)
        if generation is None:
            super()._load_model()  # Keras's own files, or none.
            return
        _resume_state.check_owned(self.backup_dir)
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        weights = os.path.join(self.backup_dir, _WEIGHTS.format(n=generation))
        _check_weights_file(weights)
        deferred = _restore_when_built(model, weights)
        with warnings.catch_warnings():
            # Keras's "Skipping variable loading for optimizer ...": the
            # deferred optimizers get theirs when built.
            if deferred:
                warnings.filterwarnings("ignore", "Skipping variable loading")
            try:
                model.load_weights(weights)
            except OSError as error:  # Keras's own on_train_begin would
                # take it for its own files' damage, and re-raise it raw.
                raise _resume_state.damaged(weights, f"unreadable ({error})") from None
        path = os.path.join(self.backup_dir, _STATE.format(n=generation))
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as error:
            raise ResumeError(
                f"Expected {path} to hold a tfdet resume state. Received: "
                f"{type(error).__name__}: {error}. Delete the backup "
                "directory to start over."
            ) from None
        self._restore(_decode_state(data, path))

    def _restore(self, state: dict[str, Any]) -> None:
        model = self.model
        where = f"epoch {state['epoch']}, {state['steps_done']} steps into it"
        _resume_state.check_same_geometry(
            self.backup_dir, where, state["fit"], self._fit_geometry()
        )
        _resume_state.check_position_in_epoch(
            self.backup_dir, state["steps_done"], (self.params or {}).get("steps")
        )
        position = {
            "epoch": state["epoch"],
            "step in epoch": state["steps_done"],
            "optimizer step": state["iterations"],
        }
        if not self._claim_restore(position):
            # Another BackupAndRestore of this fit restored the model,
            # the random state and the input's position; this one keeps
            # its own counters, and skips along with it.
            self._adopt_position(state)
            return
        iterations = int(model.optimizer.iterations.numpy())
        if iterations != state["iterations"]:
            raise ResumeError(
                f"Expected the backup in {self.backup_dir} to hold one "
                f"training state. Received: weights at optimizer step "
                f"{iterations}, random state at step {state['iterations']}. "
                "Delete the backup directory to start over."
            )
        names = [name for name, _ in seed_generators(model)]
        if names != [name for name, _ in state["seeds"]]:
            raise ResumeError(
                "Expected the model's random layers to be those of the "
                f"backup. Received: {names} now, "
                f"{[name for name, _ in state['seeds']]} saved."
            )
        # Before the global generators are restored: a PyDataset's
        # epoch hooks may draw from them, as they did in the first run.
        stream_steps = getattr(model, _FIT_STEPS_PER_EPOCH, None)
        if stream_steps is None:
            _fast_forward(getattr(model, _FIT_INPUT, None), state["epoch"])
        else:
            # One iterator for all epochs: started afresh, it must give
            # up what the finished epochs took (pulled with the skip).
            self._stream_skip = state["epoch"] * stream_steps
        for (_, generator), (_, value) in zip(
            seed_generators(model), state["seeds"], strict=True
        ):
            generator.state.assign(value)
        if state["global_seed"] is not None:
            _global_seed_generator(create=True).state.assign(state["global_seed"])
        backup_time = (state["python_random"], state["numpy_random"])
        if state["steps_done"] and state["epoch_random"] is not None:
            # The resumed epoch begins as the interrupted one began; the
            # generators take their backup-time state after the skip.
            _resume_state.set_globals(state["epoch_random"])
            self._random_after_skip = backup_time
        else:
            _resume_state.set_globals(backup_time)
        _resume_state.set_eager_seed(state["eager_seed"])
        model._initial_epoch = state["epoch"]
        self._adopt_position(state)

    def _adopt_position(self, state: dict[str, Any]) -> None:
        """This callback's counters at the restored position."""
        self._batches_seen_since_last_saving, self._last_batch_seen = state["counters"]
        # Keras restarts it at 0: a save during the first resumed epoch
        # would say epoch 0.
        self._current_epoch = state["epoch"]
        self._steps_done = state["steps_done"]
        if state["steps_done"]:
            self._saved_metrics = state["metrics"]
            self._to_skip = state["steps_done"]
        if state["steps_done"] or self._stream_skip:
            self._skip_trained_batches()

    def _skip_trained_batches(self) -> None:
        """Pulls the trained batches without training, once per fit.

        Every restoring callback counts the skipped batches down (none
        of them counts or saves them), but only the first replaces the
        train function: two would skip twice.
        """
        model = self.model
        skipping = getattr(model, _SKIPPING, None)
        if skipping is not None:
            skipping.append(self)
            return
        skipping = [self]
        object.__setattr__(model, _SKIPPING, skipping)
        original = model.train_function

        def train_function(iterator: Any) -> Any:
            for _ in range(self._stream_skip):
                next(iterator)  # Taken by the finished epochs.
            self._stream_skip = 0
            if self._to_skip <= 0:
                model.train_function = original
                return original(iterator)
            for _ in range(model.steps_per_execution):
                data = next(iterator)  # Trained on before the interruption.
            for callback in skipping:
                callback._to_skip -= model.steps_per_execution
            self._load_metrics(data)
            return model.get_metrics_result()

        model.train_function = train_function

    def _load_metrics(self, data: Any) -> None:
        # fit() builds the compiled metrics in its first traced step and
        # reset them at the epoch's start: build them now (symbolically:
        # no op runs, nothing is drawn) and load the saved accumulators.
        if self._saved_metrics is None:
            return
        model = self.model
        compiled = getattr(model, "_compile_metrics", None)
        if compiled is not None and not compiled.built:
            model._symbolic_build(data_batch=data)
        for variable, value in zip(
            model.metrics_variables, self._saved_metrics, strict=True
        ):
            variable.assign(value)
        self._saved_metrics = None


@functools.cache
def exact_backup_and_restore_class() -> type:
    """The `BackupAndRestore` subclass that resumes exactly (Keras 3)."""
    from keras.src.callbacks import backup_and_restore

    return _resume_state.exact_subclass(
        _Keras3ExactResume,
        backup_and_restore.BackupAndRestore,
        "`keras.callbacks.BackupAndRestore` that resumes bit for bit.\n\n"
        "Same arguments as Keras's (`backup_dir`, `save_freq`, `double_checkpoint` "
        "is implied, `delete_checkpoint`); see the module docstring of "
        "`tfdet.patches.keras_backup_and_restore`.",
    )


def _restore_when_built(model: Any, weights: str) -> list[str]:
    """Loads each unbuilt optimizer of `model` from `weights` once it is built.

    Keras builds `model.optimizer` before a resume can load it, but an
    optimizer that a custom `compile` sets (a GAN's `d_optimizer` and
    `g_optimizer`) is built inside the first training step, which knows the
    variables it updates; `load_weights` skips it with a warning, and the
    resumed run restarted its step count and moments. Each such optimizer
    keeps its saved values here and takes them when it is built, before its
    first update.

    Returns:
        The attribute names of the optimizers deferred.
    """
    import h5py
    import keras

    deferred = []
    for name, value in sorted(vars(model).items()):
        if not isinstance(value, keras.optimizers.Optimizer) or value.built:
            continue
        with h5py.File(weights, "r") as handle:
            group = handle.get(f"{name}/vars")
            saved = (
                [] if group is None else [group[str(i)][()] for i in range(len(group))]
            )
        if saved:
            _assign_when_built(value, saved, f"{weights} ({name})")
            deferred.append(name)
    return deferred


def _assign_when_built(optimizer: Any, saved: list[Any], source: str) -> None:
    original = optimizer.build

    def build(variables: Any) -> None:
        import tensorflow as tf

        original(variables)
        del optimizer.build  # The class's own again.
        if len(optimizer.variables) != len(saved):
            raise ResumeError(
                f"Expected optimizer {optimizer.name!r} to have the "
                f"{len(saved)} variables saved in {source}. Received: "
                f"{len(optimizer.variables)} once built. Delete the backup "
                "directory to start over."
            )
        with tf.init_scope():  # Once, now: not an op of the traced step.
            for variable, value in zip(optimizer.variables, saved, strict=True):
                variable.assign(value)

    optimizer.build = build


def _current(directory: str) -> int | None:
    """The current backup generation in `directory`; None if it holds none.

    No pointer is no backup (a process killed while it wrote its first one
    leaves generation files and no pointer: nothing was made current). A
    pointer that does not name a generation whose files are there is a
    damaged backup: resuming from nothing would train from step 0 and
    delete the directory at the end.

    Raises:
        ResumeError: naming the damaged or missing file.
    """
    pointer = os.path.join(directory, CURRENT)
    try:
        with open(pointer, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        what = f"unreadable ({type(error).__name__}: {error})"
        raise _resume_state.damaged(pointer, what) from None
    try:
        generation = int(text.strip())
        if generation < 0:
            raise ValueError(generation)
    except ValueError:
        raise _resume_state.damaged(
            pointer, f"{text[:40]!r}, not the number of a backup generation"
        ) from None
    for name in (_WEIGHTS, _STATE):
        path = os.path.join(directory, name.format(n=generation))
        if not os.path.isfile(path):
            raise _resume_state.damaged(
                path, f"missing ({CURRENT} names generation {generation})"
            )
    return generation


def _check_weights_file(path: str) -> None:
    """Refuses a weights file that HDF5 cannot open (truncated, overwritten).

    Raises:
        ResumeError: naming the file, and HDF5's reason.
    """
    import h5py

    try:
        with h5py.File(path, "r"):
            pass
    except OSError as error:
        raise _resume_state.damaged(
            path, f"not a readable HDF5 file ({error})"
        ) from None


def _fast_forward(data: Any, epochs: int) -> None:
    """Brings `fit`'s input to where the resumed epoch starts.

    A `tf.data` input that reshuffles advances its seed once per `iter()`
    (`ITERATORS_PER_EPOCH` a finished epoch). A `keras.utils.PyDataset`
    keeps its own state (an order it reshuffles in `on_epoch_end`, say):
    its epoch hooks run once per finished epoch, as `fit` ran them.
    """
    import keras
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        for _ in range(ITERATORS_PER_EPOCH * epochs):
            iter(data)
    elif isinstance(data, keras.utils.PyDataset):
        for _ in range(epochs):
            getattr(data, "on_epoch_begin", lambda: None)()
            data.on_epoch_end()


def _warn_if_resumed_without_state(model: Any, kwargs: dict[str, Any]) -> None:
    """`_resume_state.warn_if_resumed_without_state` for a Keras 3 `fit`."""
    _resume_state.warn_if_resumed_without_state(
        kwargs,
        lambda: [
            name
            for name, generator in seed_generators(model)
            if int(generator.state.numpy()[1]) == 0
        ],
    )


def wrap_fit(original: Any) -> Any:
    """Keras's `Model.fit`, noting what a resume must fast-forward."""

    @functools.wraps(original)
    def fit(self: Any, x: Any = None, *args: Any, **kwargs: Any) -> Any:
        _warn_if_resumed_without_state(self, kwargs)
        # What a resume must fast-forward: the input (`_fast_forward`).
        # Set past Keras's attribute tracking: tfdet's notes, not model state.
        object.__setattr__(self, _FIT_INPUT, x)
        object.__setattr__(
            self, _FIT_BATCH_SIZE, _resume_state.fit_arguments((x, *args), kwargs)[1]
        )
        object.__setattr__(self, _FIT_STEPS_PER_EPOCH, kwargs.get("steps_per_epoch"))
        # Which BackupAndRestore restored this fit, which ones skip.
        object.__setattr__(self, _resume_state.RESTORED_BY, None)
        object.__setattr__(self, _SKIPPING, None)
        return original(self, x, *args, **kwargs)

    return fit
