"""BackupAndRestore and ModelCheckpoint on fixed relative paths, as users write them.

Works alone (`python checkpoints_relative.py`). Runs that shared one working
directory would share `bk/` (run 1 restoring run 0's backup) and
`ckpt.weights.h5` (one HDF5 file opened by every run).
"""

import keras
import numpy as np

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.random((64, 6), dtype=np.float32)
y = rng.integers(0, 3, size=(64,))
model = keras.Sequential(
    [
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(3),
    ]
)
model.compile(
    optimizer="adam",
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
model.fit(
    x,
    y,
    batch_size=16,
    epochs=3,
    verbose=0,
    callbacks=[
        keras.callbacks.BackupAndRestore(backup_dir="bk"),
        keras.callbacks.ModelCheckpoint("ckpt.weights.h5", save_weights_only=True),
    ],
)
