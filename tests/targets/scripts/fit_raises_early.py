"""A fit that raises before its first step: inputs and labels disagree in length."""

import keras
import numpy as np

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((8, 2)), np.ones((5, 1)), epochs=1, verbose=0)
