"""Resumes from backups damaged on purpose; prints what each resume did.

`python damaged_backup.py KERAS BACKUP`: KERAS is `keras3` or `tf_keras`.
Under `tfdet.enable(seed=1)`, a fit with
`BackupAndRestore(BACKUP, delete_checkpoint=False)` leaves a whole backup;
each case damages one of its files (the pointer to the current backup, or
the weights) in a fresh copy of it and fits again with Keras's default
`BackupAndRestore(BACKUP)` (which deletes BACKUP when a fit ends). Prints
one JSON line: `{case: [exception class or "trained", message, whether
BACKUP still exists]}`.
"""

import glob
import json
import os
import shutil
import sys

import tfdet

keras_name, backup = sys.argv[1:3]
if keras_name == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
tfdet.enable(seed=1)

import numpy as np  # noqa: E402

if keras_name == "tf_keras":
    import tf_keras as keras

    # tf_keras's backup: a tf.train.Checkpoint under BACKUP/tfdet.
    POINTER = os.path.join("tfdet", "checkpoint")
    WEIGHTS = os.path.join("tfdet", "ckpt-*.data-*")
else:
    import keras

    POINTER = "tfdet_current"
    WEIGHTS = "tfdet-*.weights.h5"

x = np.random.RandomState(0).standard_normal((16, 3)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")


def fit(**kwargs):
    callback = keras.callbacks.BackupAndRestore(backup, **kwargs)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])


fit(delete_checkpoint=False)  # The whole backup, at the end of epoch 1.
whole = backup + ".whole"
shutil.copytree(backup, whole)


def write(text):
    def damage(path):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    return damage


damages = {
    "garbled pointer": (POINTER, write("§?\n")),
    "empty pointer": (POINTER, write("")),
    "missing weights": (WEIGHTS, os.remove),
    "truncated weights": (
        WEIGHTS,
        lambda path: os.truncate(path, os.path.getsize(path) // 2),
    ),
}
found = {}
for case, (name, damage) in damages.items():
    shutil.rmtree(backup, ignore_errors=True)
    shutil.copytree(whole, backup)
    (path,) = glob.glob(os.path.join(backup, name))
    damage(path)
    try:
        fit()
        found[case] = ["trained", None, os.path.isdir(backup)]
    except Exception as error:  # noqa: BLE001 - what the resume raised is the result
        found[case] = [type(error).__name__, str(error), os.path.isdir(backup)]
print(json.dumps(found))
