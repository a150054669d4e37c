"""keras.io "Simple MNIST convnet", trained from scratch on synthetic digits.

The guide's model (two Conv2D and MaxPooling2D, Flatten, Dropout, softmax;
categorical cross-entropy, Adam, accuracy), fed by `fit` with a validation
split; as a script it also keeps the best model with `ModelCheckpoint`
in the working directory, as people do.
"""

import keras
import numpy as np

NUM_CLASSES = 10


def build():
    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(NUM_CLASSES, activation="softmax"),
        ]
    )
    model.compile(
        loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"]
    )
    rng = np.random.default_rng(1)
    x = rng.random((160, 28, 28, 1), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, NUM_CLASSES, 160), NUM_CLASSES)
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        validation_split=0.2,
        callbacks=[keras.callbacks.ModelCheckpoint("best.keras", save_best_only=True)],
        verbose=0,
    )
