"""A TARGET file that chooses tf_keras itself, before importing TensorFlow.

Under `python` it builds a tf_keras model. In a process where TensorFlow was
imported first, `from tensorflow.keras import ...` gives Keras 3 instead.
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
from tensorflow.keras import layers, models  # noqa: E402


def build():
    model = models.Sequential([layers.Input((4,)), layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.RMSprop(0.01), loss="mse")
    # What tfdet must not do silently: train another Keras than `python` would.
    assert type(model).__module__.startswith("tf_keras"), type(model).__module__
    return model
