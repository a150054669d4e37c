"""train_on_batch steps on a model compiled with jit_compile=True."""

import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.standard_normal((6, 4)).astype("float32")
y = rng.standard_normal((6, 1)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse", jit_compile=True)
for step in range(3):
    model.train_on_batch(x[2 * step : 2 * step + 2], y[2 * step : 2 * step + 2])
