"""Keep the best model with ModelCheckpoint, then reload and evaluate it.

A very common ending of a training script: `keras.models.load_model` must
give back a compiled model (its loss and metrics), as under `python`.
"""

import keras
import numpy as np

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype("float32")
y = rng.standard_normal((64, 1)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
best = keras.callbacks.ModelCheckpoint("best.keras", save_best_only=True)
model.fit(x, y, validation_split=0.25, epochs=2, verbose=0, callbacks=[best])
reloaded = keras.models.load_model("best.keras")
print("evaluated", reloaded.evaluate(x, y, verbose=0))
