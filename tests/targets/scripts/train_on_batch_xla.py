"""train_on_batch steps on a model compiled with jit_compile=True.

MaxPooling3D has no deterministic XLA gradient under tfdet, so under
tfdet.enable() Keras turns XLA off and tfdet reports it.
"""

import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.standard_normal((6, 2, 2, 2, 1)).astype("float32")
y = rng.standard_normal((6, 1)).astype("float32")
model = keras.Sequential(
    [
        keras.Input((2, 2, 2, 1)),
        keras.layers.MaxPooling3D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ]
)
model.compile(optimizer="sgd", loss="mse", jit_compile=True)
for step in range(3):
    model.train_on_batch(x[2 * step : 2 * step + 2], y[2 * step : 2 * step + 2])
