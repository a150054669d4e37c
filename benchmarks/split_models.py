"""Models whose shapes cross the libraries' work-splitting thresholds.

A test whose shapes split the same way for every pool size cannot see a
product that follows the pool size. `stride_two_cnn` is the model on which
the opt-in `pool_size_free_products` once gave two digests over pools 1-8
(pools 3 and 6 apart, in the stride-2 convolution's input gradient): odd
and even channel counts that do not divide by the pool, a stride-2 layer,
BatchNormalization, Dropout, GELU, Adam with ExponentialDecay.
`depthwise_cnn` is MobileNet's kind of block, whose depthwise filter
gradient TensorFlow splits over the pool's threads by images.

Every function returns `(model, x, y)`, as `survey_models.py`'s do.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def stride_two_cnn() -> tuple[Any, np.ndarray, np.ndarray]:
    """Conv2D 3x3 (3 -> 24) + BN + ReLU, Conv2D 3x3 stride 2 (24 -> 48) + BN +
    ReLU, global pooling, Dropout, Dense GELU, Dense softmax; 24x24x3 inputs."""
    import keras

    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((24, 24, 3)),
            layers.Conv2D(24, 3, padding="same"),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.Conv2D(48, 3, strides=2),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.25),
            layers.Dense(32, activation="gelu"),
            layers.Dense(10, activation="softmax"),
        ]
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss="sparse_categorical_crossentropy",
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 24, 24, 3)).astype("float32")
    return model, x, rng.integers(0, 10, 32)


def depthwise_cnn() -> tuple[Any, np.ndarray, np.ndarray]:
    """Conv2D 3x3 stride 2 (3 -> 16) + BN + ReLU6, DepthwiseConv2D 3x3 + BN +
    ReLU6, Conv2D 1x1 (16 -> 24), DepthwiseConv2D 3x3 stride 2 with two
    filters per channel (24 -> 48), SeparableConv2D 3x3 (48 -> 32), global
    pooling, Dense softmax; 32x32x3 inputs."""
    import keras

    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(16, 3, strides=2, padding="same"),
            layers.BatchNormalization(),
            layers.ReLU(6.0),
            layers.DepthwiseConv2D(3, padding="same"),
            layers.BatchNormalization(),
            layers.ReLU(6.0),
            layers.Conv2D(24, 1),
            layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2, padding="same"),
            layers.SeparableConv2D(32, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 32, 32, 3)).astype("float32")
    return model, x, rng.integers(0, 10, 32)
