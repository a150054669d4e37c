"""What a resume needs besides weights, in a form that cannot run code.

The exact `BackupAndRestore` of Keras 3 and of tf_keras share it: the host's
random generators (Python's, NumPy's, TensorFlow's eager op seeds) as JSON
values that keep every bit, the owner check of a backup directory, and
(`ExactResume`, the mixin both start from) the agreement of several backups
of one fit and the one random state no backup can hold (ops that keep it in
their kernel), which a resume must then announce as inexact.
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfdet._errors import ResumeError

# Random ops that keep their state in their kernel (seeded once, advanced on
# each run: `tf.random.normal` and the like without a generator): no
# checkpoint holds it, so a resumed process draws their first values again.
KERNEL_STATE_RANDOM_OPS = frozenset(
    {
        "Multinomial",
        "ParameterizedTruncatedNormal",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "TruncatedNormal",
    }
)

# Note on the model for one `fit`: `(backup directory, position)` of the
# BackupAndRestore that restored it (`ExactResume._claim_restore`); the `fit`
# wrappers set it to None.
RESTORED_BY = "_tfdet_restored_by"


def array(value: Any) -> dict[str, Any]:
    import numpy as np

    value = np.asarray(value)
    return {
        "dtype": value.dtype.str,
        "shape": list(value.shape),
        "values": value.ravel().tolist(),
    }


def from_array(data: dict[str, Any]) -> Any:
    import numpy as np

    return np.asarray(data["values"], dtype=np.dtype(data["dtype"])).reshape(
        data["shape"]
    )


def python_random(state: Any) -> Any:
    """`random.getstate()` as JSON: `[version, 625 ints, gauss]`."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def from_python_random(data: Any) -> Any:
    """Inverse of `_python_random`: what `random.setstate()` takes."""
    version, internal, gauss = data
    return int(version), tuple(int(i) for i in internal), gauss


def numpy_random(state: Any) -> Any:
    """`np.random.get_state()` as JSON: `[name, keys, position, gauss...]`."""
    name, keys, position, has_gauss, cached = state
    return [name, array(keys), position, has_gauss, cached]


def from_numpy_random(data: Any) -> Any:
    """Inverse of `_numpy_random`: what `np.random.set_state()` takes."""
    name, keys, position, has_gauss, cached = data
    return str(name), from_array(keys), int(position), int(has_gauss), float(cached)


def eager_seed_generator() -> Any:
    from tensorflow.python.eager import context

    return getattr(context.context(), "_rng", None)


def host_generators() -> dict[str, Any]:
    """The host's generators now: Python's, NumPy's, TF's eager op seeds."""
    import numpy as np

    eager = eager_seed_generator()
    return {
        "python_random": random.getstate(),
        "numpy_random": np.random.get_state(),
        "eager_seed": None if eager is None else eager.getstate(),
    }


def encode_host_generators(state: dict[str, Any]) -> dict[str, Any]:
    """`host_generators()`'s keys as JSON values (every bit kept)."""
    eager = state["eager_seed"]
    return {
        "python_random": python_random(state["python_random"]),
        "numpy_random": numpy_random(state["numpy_random"]),
        "eager_seed": None if eager is None else python_random(eager),
    }


def decode_host_generators(data: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `encode_host_generators` (KeyError etc. on a bad file)."""
    eager = data["eager_seed"]
    return {
        "python_random": from_python_random(data["python_random"]),
        "numpy_random": from_numpy_random(data["numpy_random"]),
        "eager_seed": None if eager is None else from_python_random(eager),
    }


def set_eager_seed(state: Any) -> None:
    """Sets TF's eager op-seed generator to `state` (None: left as it is)."""
    generator = eager_seed_generator()
    if generator is not None and state is not None:
        generator.setstate(state)


def unreadable(source: str, state_format: int, error: Exception) -> ResumeError:
    """The error for a resume state that cannot be read back."""
    return ResumeError(
        f"Expected {source} to hold a tfdet resume state (format {state_format}). "
        f"Received: unreadable ({type(error).__name__}: {error}). Delete the "
        "backup directory to start over."
    )


def same_position(first: tuple[str, Any], other: tuple[str, Any]) -> None:
    """Refuses two backups of one fit that hold different positions.

    Args:
        first: `(backup directory, position)` of the callback that restored.
        other: the same of another restoring callback of the fit.

    Raises:
        ResumeError: naming both positions, and what to do.
    """
    (first_dir, first_position), (other_dir, other_position) = first, other
    if first_position != other_position:
        raise ResumeError(
            "Expected the BackupAndRestore callbacks of one fit to hold the "
            f"same training state. Received: {first_position} in {first_dir}, "
            f"{other_position} in {other_dir}. Keep one BackupAndRestore, or "
            "give them the same save_freq."
        )


def _traced_functions(function: Any, depth: int = 0) -> Any:
    """The `tf.function`s `function` is or calls through its closure.

    tf_keras's train function is a `tf.function`; Keras 3's is a Python
    function closing over one or two.
    """
    if hasattr(function, "_list_all_concrete_functions"):
        yield function
        return
    if depth < 3:
        for cell in getattr(function, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # An empty cell.
                yield from _traced_functions(cell.cell_contents, depth + 1)


def kernel_state_random_ops(train_function: Any) -> list[str]:
    """The `KERNEL_STATE_RANDOM_OPS` that the traced training step runs."""
    found: set[str] = set()
    for function in _traced_functions(train_function):
        for concrete in function._list_all_concrete_functions():
            graph = concrete.graph.as_graph_def()
            nodes = [
                *graph.node,
                *(n for f in graph.library.function for n in f.node_def),
            ]
            found |= {node.op for node in nodes} & KERNEL_STATE_RANDOM_OPS
    return sorted(found)


if TYPE_CHECKING:

    class _BackupAndRestore:
        """What the mixins use of Keras's `BackupAndRestore` (Keras 3's and
        tf_keras's alike), which comes after them in the subclass: for the
        type checker only, as Keras ships no types."""

        model: Any
        backup_dir: str

        def on_train_begin(self, logs: Any = None) -> None: ...

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None: ...

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None: ...

        def on_train_end(self, logs: Any = None) -> None: ...

        def _load_model(self) -> None: ...  # Keras 3's only.

else:
    _BackupAndRestore = object


class ExactResume(_BackupAndRestore):
    """What the exact `BackupAndRestore` of Keras 3 and of tf_keras share.

    The mixin each one's own starts from (`_keras3._Keras3ExactResume`,
    `_tf_keras._TfKerasExactResume`); the subclass puts them before Keras's
    class, which their `super()` calls reach.
    """

    _tfdet_exact = True  # Asked by the factories, `warn_if_resumed_without_state`.

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._random_checked = False  # `_warn_if_kernel_state_random`.

    def _warn_if_kernel_state_random(self) -> None:
        """Says a resume is not exact when the step draws from kernel-held state.

        Asked once, as the first backup is made (the step is traced by then).
        """
        if self._random_checked:
            return
        found = kernel_state_random_ops(self.model.train_function)
        if found:
            warnings.warn(
                f"tfdet: the training step runs random ops that keep their state "
                f"in their kernel ({', '.join(found)}: tf.random.normal and the "
                "like without a generator), which no backup can hold: a resumed "
                "fit draws their first values again, so the resume is not exact. "
                "Draw from a keras.random.SeedGenerator (Keras 3), a "
                "tf.random.Generator the model tracks, or stateless ops.",
                stacklevel=3,
            )
        self._random_checked = True

    def _claim_restore(self, position: dict[str, Any]) -> bool:
        """Whether this callback is the first of its fit to restore the model.

        The first notes `(backup_dir, position)` on the model (`RESTORED_BY`)
        and restores the random state and the input's position; any other
        must hold the same position (`same_position` raises if not).
        """
        model = self.model
        first = getattr(model, RESTORED_BY, None)
        if first is not None:
            same_position(first, (self.backup_dir, position))
            return False
        object.__setattr__(model, RESTORED_BY, (self.backup_dir, position))
        return True


def exact_subclass(mixin: type, base: type, doc: str) -> type:
    """`base` (a Keras flavour's `BackupAndRestore`) with `mixin` (its
    `ExactResume`) in front: the callback that resumes bit for bit, named
    where Keras's is. `base` itself when it is already that class (asked
    while `keras_backup_and_restore` has it installed)."""
    if getattr(base, "_tfdet_exact", False):
        return base
    return type(
        "ExactBackupAndRestore",
        (mixin, base),
        {"__doc__": doc, "__module__": base.__module__},
    )


def check_owned(directory: str) -> None:
    """Refuses to resume from a backup directory someone else controls.

    What a resume reads decides the training (weights, optimizer state, the
    random state): a directory another user owns, or any user may write to, could
    hold another training's backup or a planted one (Keras's own example
    directory, `/tmp/backup`, is one any local user can create first).

    Raises:
        ResumeError: with the directory, its owner or mode, and what to do.
    """
    if not hasattr(os, "getuid"):  # No POSIX owners (Windows).
        return
    info = os.stat(directory)
    problem = None
    if info.st_uid != os.getuid():
        problem = f"owned by user id {info.st_uid}, not {os.getuid()}"
    elif info.st_mode & stat.S_IWOTH:
        # Group-writable is left alone: with a user's private group (umask
        # 002) every directory of theirs is.
        problem = f"writable by every user (mode {stat.filemode(info.st_mode)})"
    if problem is not None:
        raise ResumeError(
            f"Expected the backup directory {directory} to be yours alone: a "
            f"resume reads the training state from it. Received: {problem}. "
            "Use a backup_dir of your own (not a shared /tmp path), or make it "
            "yours with `chmod go-w` if you trust what is in it."
        )


def set_globals(pair: Any) -> None:
    """Sets Python's and NumPy's global generators to `(python, numpy)`."""
    import numpy as np

    python, numpy_state = pair
    random.setstate(python)
    np.random.set_state(numpy_state)


def warn_if_resumed_without_state(
    fit_kwargs: dict[str, Any], fresh_random_layers: Callable[[], list[str]]
) -> None:
    """Says so when `fit(initial_epoch=E)` continues a model that lost its state.

    The manual resume of Keras's docs (`ModelCheckpoint`, `load_model`,
    `fit(initial_epoch=E)`) restores weights and optimizer only: the random
    layers' seed states start over (a saved model holds none), so the
    resumed epochs draw the first epochs' Dropout masks again, and the
    weights differ from those of the run that never stopped.

    Args:
        fit_kwargs: The keyword arguments of the `fit` call.
        fresh_random_layers: The names of the model's random layers at their
            first state (asked only for a resumed fit without an exact
            `BackupAndRestore`).
    """
    initial_epoch = fit_kwargs.get("initial_epoch") or 0
    callbacks = fit_kwargs.get("callbacks") or []
    callbacks = getattr(callbacks, "callbacks", callbacks)  # A CallbackList.
    if initial_epoch <= 0 or any(
        getattr(callback, "_tfdet_exact", False) for callback in callbacks
    ):
        return
    fresh = fresh_random_layers()
    if fresh:
        warnings.warn(
            f"tfdet: fit(initial_epoch={initial_epoch}) continues a model whose "
            f"random layers ({', '.join(fresh[:3])}"
            f"{', ...' if len(fresh) > 3 else ''}) start from their first state "
            "(a saved model holds no seed state): the resumed epochs draw the "
            "first epochs' masks again, so this resume is not exact. "
            "keras.callbacks.BackupAndRestore resumes exactly under tfdet; in a "
            "custom loop, put tfdet.random_state(model) in the checkpoint.",
            stacklevel=4,
        )


# `fit`'s batch size when it is given arrays and none (Keras 3 and tf_keras).
FIT_DEFAULT_BATCH_SIZE = 32
# What a backup's position is counted in, as the messages name it.
_GEOMETRY_NAMES = {
    "steps_per_epoch": "steps per epoch",
    "batch_size": "batch size",
    "samples": "samples",
}


def fit_arguments(args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """`(x, batch_size)` of a `fit(x, y, batch_size, ...)` call (self left out).

    Keras 3 and tf_keras name them alike and in the same order.
    """
    x = args[0] if args else kwargs.get("x")
    batch_size = args[2] if len(args) > 2 else kwargs.get("batch_size")
    return x, batch_size


def _samples(x: Any) -> int | None:
    """The number of samples of array input `x`; None for any other input.

    A `tf.data.Dataset`, a `PyDataset` or a generator has no `shape`: its
    size is its own, and only its epoch length is known to `fit`.
    """
    while isinstance(x, list | tuple | dict) and x:  # Several inputs.
        x = next(iter(x.values())) if isinstance(x, dict) else x[0]
    shape: Any = getattr(x, "shape", None)  # An array's, or TensorFlow's.
    try:
        return int(shape[0])
    except (TypeError, IndexError, ValueError):  # None, (), or unknown.
        return None


def fit_geometry(x: Any, batch_size: Any, steps_per_epoch: Any) -> dict[str, Any]:
    """What a backup's position is counted in, for this `fit`.

    A position (epoch E, step S) names the same batches in another process
    only when the epochs are as long and cut alike: `fit`'s steps per epoch,
    and, for arrays, the number of samples and the batch size (one that
    changes the last batch's size only keeps the epoch length).

    Args:
        x: `fit`'s input.
        batch_size: `fit`'s `batch_size` argument.
        steps_per_epoch: `fit`'s steps per epoch (the callbacks' `params`),
            None if unknown.

    Returns:
        `{"steps_per_epoch", "batch_size", "samples"}`, None where unknown
        or meaningless (no batch size but for arrays).
    """
    samples = _samples(x)
    if samples is not None and batch_size is None:
        batch_size = FIT_DEFAULT_BATCH_SIZE
    return {
        "steps_per_epoch": None if steps_per_epoch is None else int(steps_per_epoch),
        "batch_size": None if samples is None else int(batch_size),
        "samples": samples,
    }


def decode_geometry(data: Any) -> dict[str, int | None] | None:
    """The `fit_geometry` a backup holds (KeyError etc. if malformed)."""
    if data is None:
        return None
    return {
        key: None if data[key] is None else int(data[key]) for key in _GEOMETRY_NAMES
    }


def check_same_geometry(
    backup: str, position: str, saved: dict[str, Any] | None, now: dict[str, Any]
) -> None:
    """Refuses a resume whose `fit` cuts its epochs otherwise than the backup's.

    Resumed at the backup's position with other epochs (a new batch size, a
    data set that shrank or grew), `fit` would skip batches it never trained
    or train some twice, across epoch boundaries, and say nothing.

    Args:
        backup: The backup (directory or file), for the message.
        position: The backup's position in words (epoch, step).
        saved: `fit_geometry` of the fit that wrote the backup; None in a
            backup of a tfdet that did not record it (nothing to compare).
        now: `fit_geometry` of the resumed fit.

    Raises:
        ResumeError: naming each value that differs, the backup's and this
            fit's.
    """
    if saved is None:
        return
    differences = [
        f"{name} {saved.get(key)} in the backup, {now[key]} now"
        for key, name in _GEOMETRY_NAMES.items()
        if saved.get(key) is not None
        and now[key] is not None
        and saved.get(key) != now[key]
    ]
    if differences:
        raise ResumeError(
            f"Expected the fit resumed from {backup} to cut its epochs as the "
            f"fit that wrote the backup did. Received: {'; '.join(differences)}. "
            f"Resumed at the backup's position ({position}), it would skip "
            "batches never trained or train some twice. Resume with the "
            "backup's settings and data, or delete the backup directory to "
            "start over."
        )


def check_position_in_epoch(backup: str, steps_done: int, steps_per_epoch: Any) -> None:
    """Refuses a mid-epoch position past the resumed fit's epoch length.

    Backups that hold no `fit_geometry` are checked this far.

    Raises:
        ResumeError: naming the backup's step and the epoch length now.
    """
    if steps_per_epoch is not None and steps_done > int(steps_per_epoch) > 0:
        raise ResumeError(
            f"Expected the fit resumed from {backup} to have the backup's "
            f"position in its epochs. Received: {steps_done} steps of the epoch "
            f"trained in the backup, {steps_per_epoch} steps per epoch now. "
            "Resume with the backup's settings and data, or delete the backup "
            "directory to start over."
        )


def damaged(path: str, what: str) -> ResumeError:
    """The error for a backup file a resume cannot read.

    Raised before training and before anything is deleted: the backup is
    left as it is (Keras deletes its directory when a fit ends).
    """
    return ResumeError(
        f"Expected {path} to be as the tfdet backup wrote it. Received: "
        f"{what}. The backup is left as it is: restore the file, or delete the "
        "backup directory to start over."
    )
