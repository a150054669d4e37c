"""A script's run keeps its own copy of the training state outside its directory.

The runs of `tfdet check --script` (and `tfdet cost`'s script) start
together, each in its own directory (its mirror of the working directory).
A backup directory such as Keras's own example `/tmp/backup` (or
`../backup`, outside the run's mirror) would be one directory for all of
them, and a run would resume from another's backup: Keras 3's
`BackupAndRestore` (`backup_dir`) and `tf.train.CheckpointManager`
(`directory`) get the run's own copy of such a path instead
(`own_training_state`), listed for the report (`own_copies`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

# Where a run keeps its own copy of a training-state path that lies outside
# its directory (inside the run's mirror of the working directory).
PRIVATE_DIR = ".tfdet-own-copies"
# `{path the script gave: the run's own copy}`, for the report.
own_copies: dict[str, str] = {}
# The run's own directory (its mirror): the working directory the script
# started in, whatever `os.chdir` it calls later (set by
# `_script_worker.run`).
run_directory: str | None = None


def own_copy(path: Any) -> Any:
    """The run's own copy of a training-state path outside its directory.

    The runs start together: a backup directory such as Keras's own example
    `/tmp/backup` (or `../backup`, outside the run's mirror) was one
    directory for all of them, and a run resumed from another's backup. A
    path inside the run's directory is its own already and stays as it is.
    A relative path is resolved as the script meant it, against its working
    directory now, and compared with the run's own directory, which a
    script's `os.chdir` elsewhere does not move.
    """
    if not isinstance(path, str | os.PathLike):
        return path
    absolute = os.path.abspath(os.fspath(path))
    here = run_directory or os.getcwd()
    if absolute == here or absolute.startswith(here + os.sep):
        return path
    private = os.path.join(here, PRIVATE_DIR, absolute.lstrip(os.sep))
    own_copies[os.fspath(path)] = private
    return private


def _with_own_copy(owner: Any, parameter: str) -> None:
    """Makes `owner(...)` get the run's own copy of its `parameter` path."""
    import inspect

    original = owner.__init__
    # The signature that names it: tfdet's exact BackupAndRestore passes
    # `*args, **kwargs` on to Keras's.
    signature = next(
        sig
        for cls in owner.__mro__
        if "__init__" in vars(cls)
        and parameter in (sig := inspect.signature(vars(cls)["__init__"])).parameters
    )

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # Keras says what is wrong.
        if parameter in bound.arguments:
            bound.arguments[parameter] = own_copy(bound.arguments[parameter])
        original(*bound.args, **bound.kwargs)

    owner.__init__ = __init__


def own_training_state() -> None:
    """Gives each run its own copy of the paths that hold training state.

    Keras 3's BackupAndRestore (`backup_dir`) and `tf.train.CheckpointManager`
    (`directory`): a resume reads them back through the same object, so the
    script never names the copy itself. A `ModelCheckpoint` file is left
    where it is: scripts load it back by its path (`load_model(path)`),
    which the copy would miss. Other absolute writes stay shared.
    """
    import keras
    import tensorflow as tf

    _with_own_copy(keras.callbacks.BackupAndRestore, "backup_dir")
    _with_own_copy(tf.train.CheckpointManager, "directory")
