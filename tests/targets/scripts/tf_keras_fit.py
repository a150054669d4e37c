"""A tf_keras script that picks its Keras itself: fit, then a custom loop."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 4)).astype("float32")
y = rng.standard_normal((8, 1)).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
assert type(model).__module__.startswith("tf_keras"), type(model).__module__
model.compile(optimizer=tf.keras.optimizers.RMSprop(0.01), loss="mse")
model.fit(x, y, batch_size=4, epochs=1, verbose=0)
optimizer = tf.keras.optimizers.SGD(0.1)
for step in range(2):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[step : step + 4]) - y[step : step + 4]) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
