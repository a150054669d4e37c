"""The models of `gpu_cost.py`, as TARGETs (`benchmarks/gpu_models.py:conv`).

The three kinds of model whose GPU step time made users switch determinism
off: convolutions with BatchNormalization and max-pooling (cuDNN
convolutions), cuDNN recurrent layers (LSTM, GRU), and attention. Each returns
`(model, x, y)` with 64 synthetic samples; Keras's default `jit_compile`
("auto": XLA on a GPU where Keras supports it) is kept, because that is what
a user gets.
"""

from __future__ import annotations

import numpy as np

SAMPLES = 64


def _data(x_shape: tuple[int, ...], classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, *x_shape)).astype("float32")
    y = rng.integers(0, classes, SAMPLES)
    return x, y


def _compiled(model, optimizer):
    import keras

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def conv():
    """Conv2D + BatchNormalization + MaxPooling2D + Dropout, Adam."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    return (_compiled(model, keras.optimizers.Adam(1e-3)), *_data((32, 32, 3), 10))


def rnn():
    """cuDNN LSTM(64) + GRU(32) over 40 steps of 16 features, Adam."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((40, 16)),
            keras.layers.LSTM(64, return_sequences=True),
            keras.layers.GRU(32),
            keras.layers.Dense(5),
        ]
    )
    return (_compiled(model, keras.optimizers.Adam(1e-3)), *_data((40, 16), 5))


def attention():
    """MultiHeadAttention + LayerNormalization + GELU feed-forward, AdamW."""
    import keras

    inputs = keras.Input((32, 64))
    attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16)(inputs, inputs)
    hidden = keras.layers.LayerNormalization()(inputs + attended)
    feed_forward = keras.layers.Dense(128, activation="gelu")(hidden)
    hidden = keras.layers.LayerNormalization()(
        hidden + keras.layers.Dense(64)(feed_forward)
    )
    outputs = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling1D()(hidden))
    model = keras.Model(inputs, outputs)
    return (_compiled(model, keras.optimizers.AdamW(1e-3)), *_data((32, 64), 5))
