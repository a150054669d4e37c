"""A fit that backs itself up after every batch, as a preemptible job does.

Dense + Dropout, Adam, shuffled: 64 samples in batches of 16 (4 steps an
epoch), 3 epochs, `keras.callbacks.BackupAndRestore("backup", save_freq=1)`.
Killed and started again, it resumes from its last backup.
"""

import keras
import numpy as np

keras.utils.set_random_seed(4)
rng = np.random.default_rng(0)
x = rng.random((64, 6), dtype=np.float32)
y = rng.integers(0, 3, size=(64,))
model = keras.Sequential(
    [
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.3),
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
    shuffle=True,
    verbose=0,
    callbacks=[keras.callbacks.BackupAndRestore("backup", save_freq=1)],
)
