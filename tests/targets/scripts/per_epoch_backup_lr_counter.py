"""Keras's default BackupAndRestore (one backup per epoch) and a learning-rate
schedule kept in a Python counter outside the backup.

Dense, SGD; 64 samples in batches of 16 (4 steps an epoch), 3 epochs. The
callback lowers the learning rate after every batch this process trained:
killed and resumed, the counter starts again at 0, so the resumed epochs
train with other rates. Its resume is inexact whatever tfdet does, which an
interrupt must be able to find at Keras's default save frequency.
"""

import keras
import numpy as np


class DecayEveryBatch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0  # Not in any backup.

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate.assign(0.1 / (1 + self.batches))
        self.batches += 1


rng = np.random.default_rng(0)
x = rng.random((64, 6), dtype=np.float32)
y = rng.random((64, 1), dtype=np.float32)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(
    x,
    y,
    batch_size=16,
    epochs=3,
    verbose=0,
    callbacks=[keras.callbacks.BackupAndRestore("backup"), DecayEveryBatch()],
)
