"""keras.io "Image classification from scratch", small.

Random augmentation layers in the model (RandomFlip, RandomRotation),
Rescaling, a small Xception-like network (SeparableConv2D, BatchNormalization,
residual additions), binary cross-entropy; as a script, a `tf.data` pipeline
with the augmentation mapped over it and `ModelCheckpoint` saving every epoch.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

IMAGE_SIZE = (48, 48)


def make_model(input_shape):
    inputs = keras.Input(shape=input_shape)
    x = layers.RandomFlip("horizontal")(inputs)
    x = layers.RandomRotation(0.1)(x)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(32, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for size in [64, 128]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(
            previous_block_activation
        )
        x = layers.add([x, residual])
        previous_block_activation = x
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    outputs = layers.Dense(1, activation=None)(x)
    return keras.Model(inputs, outputs)


def build():
    model = make_model(input_shape=IMAGE_SIZE + (3,))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(name="acc")],
    )
    rng = np.random.default_rng(2)
    x = (rng.random((64,) + IMAGE_SIZE + (3,)) * 255).astype("float32")
    y = rng.integers(0, 2, (64, 1)).astype("float32")
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    train_ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(2)
    model.fit(
        train_ds,
        epochs=2,
        callbacks=[keras.callbacks.ModelCheckpoint("save_at_{epoch}.keras")],
        verbose=0,
    )
