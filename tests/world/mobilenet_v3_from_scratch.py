"""Keras applications' MobileNetV3Small trained from scratch (`weights=None`).

Hard-swish, squeeze-and-excitation, depthwise convolutions,
BatchNormalization; as a script, with `BackupAndRestore` (the fault
tolerance Keras recommends) and a `CSVLogger` in the working directory.
"""

import keras
import numpy as np


def build():
    model = keras.applications.MobileNetV3Small(
        input_shape=(64, 64, 3),
        weights=None,
        classes=10,
        include_preprocessing=True,
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    rng = np.random.default_rng(7)
    x = (rng.random((64, 64, 64, 3)) * 255).astype("float32")
    y = rng.integers(0, 10, (64,))
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        callbacks=[
            keras.callbacks.BackupAndRestore("backup"),
            keras.callbacks.CSVLogger("training.csv", append=True),
        ],
        verbose=0,
    )
