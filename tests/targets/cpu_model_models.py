"""TARGET whose training step reaches every op whose CPU bits depend on the CPU model.

`keras3` builds a small Keras 3 model: BatchNormalization (`Rsqrt`), an exact
GELU (`Erfc`), a `keras.ops.reciprocal` layer (`Reciprocal`) and a softmax
head (`Softmax`), trained with Adam.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def keras3() -> tuple[Any, np.ndarray, np.ndarray]:
    """Keras 3 model reaching Rsqrt, Erfc, Reciprocal and Softmax."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.random((16, 6, 6, 2), dtype=np.float32)
    y = rng.integers(0, 3, size=(16,)).astype(np.int32)
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Activation(lambda t: keras.activations.gelu(t), name="gelu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Lambda(
        lambda t: keras.ops.reciprocal(1.0 + t * t), name="inverse"
    )(h)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model, x, y
