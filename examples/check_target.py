"""A TARGET for `tfdet check`, `tfdet locate` and `tfdet scan`.

    tfdet check examples/check_target.py:build
    tfdet check examples/check_target.py:build --no-enable   # what you get without tfdet

The function takes no arguments and returns a compiled Keras model, or
`(model, x, y)` to train on your own data. Without data, tfdet synthesizes
seeded batches from the model's input and output shapes.
"""

import keras
import numpy as np


def build():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    # Your data goes here; a seeded stand-in keeps the example self-contained.
    rng = np.random.default_rng(0)
    x = rng.random((128, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=128)
    return model, x, y
