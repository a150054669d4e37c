"""A script laid out as real projects are: code/ beside data/, out/ a link.

Reads its data from `../data/values.txt` (code/ and data/ are siblings),
writes a ModelCheckpoint and a BackupAndRestore into `out/`, a symbolic link
to a scratch directory elsewhere, as clusters set up. Its working directory
also holds a FIFO (a named pipe another tool left there).
"""

import keras
import numpy as np

values = np.loadtxt("../data/values.txt", dtype=np.float32)
x = values.reshape(-1, 4)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(
    x,
    y,
    batch_size=4,
    epochs=2,
    verbose=0,
    callbacks=[
        keras.callbacks.ModelCheckpoint("out/ckpt.weights.h5", save_weights_only=True),
        keras.callbacks.BackupAndRestore("out/backup", save_freq=1),
    ],
)
