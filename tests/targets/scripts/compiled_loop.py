"""A custom training loop whose step is a tf.function."""

import keras
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 4)).astype("float32")
y = rng.standard_normal((8, 1)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.1)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(xb) - yb) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


for step in range(3):
    train_step(x[step : step + 4], y[step : step + 4])
