"""A custom GradientTape training loop, no fit. `--urandom` adds noise from
os.urandom to the data: not repeatable with or without tfdet."""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 4)).astype("float32")
y = rng.standard_normal((8, 1)).astype("float32")
if "--urandom" in sys.argv[1:]:
    x += np.frombuffer(os.urandom(x.size), np.uint8).reshape(x.shape) / 255.0

# Unseeded initializers: only tfdet's seed makes them repeatable.
model = keras.Sequential(
    [keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)]
)
optimizer = keras.optimizers.Adam(0.01)
for step in range(4):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[step : step + 4]) - y[step : step + 4]) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
print("custom loop done")
