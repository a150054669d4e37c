"""Mentions tf_keras only in a comment and a string: it trains with Keras 3."""

import os

# os.environ["TF_USE_LEGACY_KERAS"] = "1"
NOTE = 'os.environ["TF_USE_LEGACY_KERAS"] = "1" would pick tf_keras'
print(os.environ.get("TF_USE_LEGACY_KERAS"))

import keras  # noqa: E402
import numpy as np  # noqa: E402

x = np.linspace(0, 1, 16, dtype=np.float32).reshape(8, 2)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
