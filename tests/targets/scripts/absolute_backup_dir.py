"""Keras's documented BackupAndRestore example: an absolute `/tmp/backup`.

The directory is taken from argv[1] (an absolute path outside the working
directory, as `/tmp/backup` is); 3 epochs of a Dense + Dropout model with a
backup after every batch. The runs of a check start together: sharing the
directory, one resumed from another's backup.
"""

import sys

import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.random((64, 6), dtype=np.float32)
y = rng.random((64, 1), dtype=np.float32)
model = keras.Sequential(
    [
        keras.Input((6,)),
        keras.layers.Dense(8),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(1),
    ]
)
model.compile(optimizer="adam", loss="mse")
backup = keras.callbacks.BackupAndRestore(backup_dir=sys.argv[1], save_freq=1)
model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[backup])
