"""A tf.data pipeline with a parallel map and an unseeded random op, then fit.

No seeds anywhere: without tfdet every process draws other noise.
"""

import keras
import tensorflow as tf


def augment(x, y):
    # Unseeded: its op seed comes from the global seed, set only by tfdet.
    return x + tf.random.uniform(tf.shape(x), maxval=0.1), y


x = tf.reshape(tf.range(64, dtype=tf.float32), (16, 4)) / 64.0
y = tf.reshape(tf.range(16, dtype=tf.float32), (16, 1)) / 16.0
data = (
    tf.data.Dataset.from_tensor_slices((x, y))
    .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    .batch(4)
)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(data, epochs=1, verbose=0)
