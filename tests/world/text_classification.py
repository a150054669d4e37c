"""keras.io "Text classification from scratch", on synthetic token ids.

Embedding, Dropout, two strided Conv1D, GlobalMaxPooling1D, Dense, sigmoid;
binary cross-entropy, Adam; as a script, fed by a shuffled `tf.data`
pipeline with a validation set.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

MAX_FEATURES = 2000
SEQUENCE_LENGTH = 100
EMBEDDING_DIM = 64


def build():
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = layers.Embedding(MAX_FEATURES, EMBEDDING_DIM)(inputs)
    x = layers.Dropout(0.5)(x)
    x = layers.Conv1D(64, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.Conv1D(64, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    rng = np.random.default_rng(3)
    x = rng.integers(1, MAX_FEATURES, (128, SEQUENCE_LENGTH)).astype("int64")
    y = rng.integers(0, 2, (128, 1)).astype("float32")
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    train = tf.data.Dataset.from_tensor_slices((x[:96], y[:96]))
    train = train.shuffle(96, seed=1337).batch(32).cache().prefetch(10)
    val = tf.data.Dataset.from_tensor_slices((x[96:], y[96:])).batch(32)
    model.fit(train, validation_data=val, epochs=2, verbose=0)
