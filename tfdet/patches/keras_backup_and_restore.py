"""Exact resume with Keras 3's `BackupAndRestore`: the run you would have had.

A `fit` interrupted and resumed in a fresh process by
`keras.callbacks.BackupAndRestore` gets other weights than the same `fit`
uninterrupted (docs/how-to/resume.md). What Keras 3's backup loses:

- every `SeedGenerator` state (Dropout's masks, `keras.random.*`): a layer
  saves only its weights (`Layer.save_own_variables`), so the resumed epochs
  replayed epoch 0's dropout masks; the global generator is saved nowhere;
- the position inside an epoch: Keras writes `{"epoch", "batch"}` but reads
  back only the epoch, so a resume after `save_freq=N` retrained the
  epoch's first batches; and its epoch counter restarts at 0 in the resumed
  process, so a second interruption restarted training from epoch 0;
- the order of a `tf.data` input that reshuffles on each iteration (its seed
  generator advances once per `iter()`, two per epoch in Keras 3.15's fit);
- with `steps_per_epoch`, where the input's stream stood: Keras then draws
  every epoch from one iterator (a generator, a repeated `tf.data`), and a
  resumed `fit` starts a fresh one at the stream's first batch, so a resume
  at epoch E retrained epoch 0's batches; the resume pulls the
  `E * steps_per_epoch` batches the finished epochs took;
- the metric accumulators of an epoch resumed in its middle;
- Python's and NumPy's global generators and TF's eager op-seed generator,
  for code that draws from them while training; and, for a resume in the
  middle of an epoch, the two global generators as the epoch began: what was
  drawn there is drawn again when the resumed epoch begins (a
  `keras.utils.PyDataset` under `fit(shuffle=True)` has Keras draw its batch
  order with `random.shuffle` as each epoch's iterator starts).

This patch puts `ExactBackupAndRestore` (a subclass) where Keras's class is
looked up, so `keras.callbacks.BackupAndRestore(...)` saves and restores all
of it, and skips (pulls without training) the batches an interrupted epoch
had already trained. Each backup is a generation of its own, made current by
one atomic rename: a process killed while writing leaves the previous
backup current, and a resume never mixes two. What is not a weight is
written as JSON (numbers and arrays of numbers), never pickled: the backup
directory is often a shared path (`/tmp/backup` in Keras's own example),
and reading a pickle from it would run whatever code was planted there.
`tfdet.random_state(model)` gives the same seed states to a
`tf.train.Checkpoint` of a custom loop.

The implementation is in `tfdet._resume` (`_keras3`). tf_keras's
`BackupAndRestore` (when tf_keras is imported) is made exact the
same way by `tfdet._resume._tf_keras`, which says what tf_keras's
backup loses.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import KERAS3, Patch
from tfdet._resume import _keras3


def _install_for_tf_keras(swap: Any) -> None:
    from tfdet._resume import _tf_keras

    _tf_keras.install(swap)


def _apply(swap: Any) -> None:
    import keras
    from keras.src import callbacks
    from keras.src.callbacks import backup_and_restore

    exact = _keras3.exact_backup_and_restore_class()
    for owner in (keras.callbacks, callbacks, backup_and_restore):
        swap.attribute(owner, "BackupAndRestore", exact)
    swap.attribute(keras.Model, "fit", _keras3.wrap_fit(keras.Model.fit))


PATCH = Patch(
    summary="keras.callbacks.BackupAndRestore (loses seed states, the position "
    "in an epoch and in the input's stream, tf.data and PyDataset order) -> a "
    "subclass that resumes bit for bit; tf_keras's (and its random layers, on "
    "TF generators) likewise",
    upstream="https://github.com/keras-team/keras/blob/master/keras/src/callbacks/backup_and_restore.py",
    apply=_apply,
    # Also tf_keras's callback, once tf_keras is imported (whenever that is).
    after_import=(("tf_keras", _install_for_tf_keras),),
    requires={"keras": KERAS3["keras"]},
)
