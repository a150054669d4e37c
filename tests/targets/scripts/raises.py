"""A training script that fails half-way."""

import keras

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
raise RuntimeError("the data directory is missing")
