"""keras.io "Image segmentation with a U-Net-like architecture", small.

Downsampling with SeparableConv2D, BatchNormalization and residual
projections, upsampling with Conv2DTranspose and UpSampling2D, a per-pixel
softmax; sparse categorical cross-entropy, RMSprop; as a script, with
`ModelCheckpoint` and a `tf.data` pipeline.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

IMG_SIZE = (64, 64)
NUM_CLASSES = 3


def get_model(img_size, num_classes):
    inputs = keras.Input(shape=img_size + (3,))
    x = layers.Conv2D(32, 3, strides=2, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for filters in [64, 128]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(filters, 1, strides=2, padding="same")(
            previous_block_activation
        )
        x = layers.add([x, residual])
        previous_block_activation = x
    for filters in [128, 64, 32]:
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.Conv2DTranspose(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.UpSampling2D(2)(x)
        residual = layers.UpSampling2D(2)(previous_block_activation)
        residual = layers.Conv2D(filters, 1, padding="same")(residual)
        x = layers.add([x, residual])
        previous_block_activation = x
    outputs = layers.Conv2D(num_classes, 3, activation="softmax", padding="same")(x)
    return keras.Model(inputs, outputs)


def build():
    model = get_model(IMG_SIZE, NUM_CLASSES)
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss="sparse_categorical_crossentropy",
    )
    rng = np.random.default_rng(5)
    x = rng.random((32,) + IMG_SIZE + (3,), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, (32,) + IMG_SIZE + (1,))
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model.fit(
        dataset,
        epochs=2,
        callbacks=[keras.callbacks.ModelCheckpoint("oxford_segmentation.keras")],
        verbose=0,
    )
