"""The zoo: models people train, at sizes where a step's time is in the ops.

TARGETs for `tfdet cost` (`tfdet cost benchmarks/zoo.py:NAME`) and the
benchmarks that price determinism on realistic work, next to the built-in
CNN (`builtin:cnn`, a small Keras example):

- `resnet50`: keras.applications.ResNet50 (weights=None), 64x64 RGB, 10
  classes, SGD with momentum: convolutions, BatchNormalization, ReLU.
- `mobilenet_v2`: keras.applications.MobileNetV2 (weights=None), 96x96:
  depthwise convolutions, ReLU6, BatchNormalization, Adam.
- `encoder`: a BERT-small-like text classifier: token and position
  Embedding, two blocks of MultiHeadAttention (4 heads of 64), exact GELU
  feed-forward (1024), LayerNormalization, sequence 128, AdamW, sparse
  categorical cross-entropy.
- `lstm_text`: Embedding, a bidirectional LSTM and a GRU over 100 tokens,
  binary cross-entropy, RMSprop.

Each returns `(model, x, y)` with 64 samples drawn from a seeded NumPy
generator; `tfdet cost` and `check` train them in batches of 32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SAMPLES = 64
CLASSES = 10
VOCABULARY = 8000


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _images(size: int) -> np.ndarray:
    return _rng().standard_normal((SAMPLES, size, size, 3)).astype("float32")


def _tokens(length: int) -> np.ndarray:
    return _rng().integers(1, VOCABULARY, (SAMPLES, length)).astype("int32")


def _labels(classes: int = CLASSES) -> np.ndarray:
    return _rng().integers(0, classes, SAMPLES)


def resnet50() -> tuple[Any, np.ndarray, np.ndarray]:
    import keras

    model = keras.applications.ResNet50(
        weights=None, input_shape=(64, 64, 3), classes=CLASSES
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss="sparse_categorical_crossentropy",
    )
    return model, _images(64), _labels()


def mobilenet_v2() -> tuple[Any, np.ndarray, np.ndarray]:
    import keras

    model = keras.applications.MobileNetV2(
        weights=None, input_shape=(96, 96, 3), classes=CLASSES
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model, _images(96), _labels()


def encoder(
    length: int = 128, width: int = 256, heads: int = 4, blocks: int = 2
) -> tuple[Any, np.ndarray, np.ndarray]:
    import keras

    L = keras.layers
    tokens = keras.Input((length,), dtype="int32")
    positions = L.Embedding(length, width)(keras.ops.arange(length))
    x = L.Embedding(VOCABULARY, width)(tokens) + positions
    for _ in range(blocks):
        attended = L.MultiHeadAttention(heads, width // heads)(x, x)
        x = L.LayerNormalization()(x + attended)
        hidden = L.Dense(4 * width, activation=keras.activations.gelu)(x)
        x = L.LayerNormalization()(x + L.Dense(width)(hidden))
    logits = L.Dense(CLASSES)(L.GlobalAveragePooling1D()(x))
    model = keras.Model(tokens, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, _tokens(length), _labels()


def lstm_text(length: int = 100) -> tuple[Any, np.ndarray, np.ndarray]:
    import keras

    L = keras.layers
    model = keras.Sequential(
        [
            keras.Input((length,), dtype="int32"),
            L.Embedding(VOCABULARY, 128),
            L.Bidirectional(L.LSTM(128, return_sequences=True)),
            L.GRU(128),
            L.Dense(1),
        ]
    )
    model.compile(
        optimizer="rmsprop",
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model, _tokens(length), _labels(2).astype("float32")


NAMES = ("resnet50", "mobilenet_v2", "encoder", "lstm_text")


def load(name: str) -> tuple[Any, Any, Any]:
    """`(model, x, y)` of a zoo model by its function's name, or of
    `builtin:NAME`, a built-in target with the seeded batches `tfdet check`
    synthesizes for it (the benchmarks that take both kinds by name)."""
    if name.startswith("builtin:"):
        from tfdet._target import _builtins, _load

        model = _builtins.get(name.removeprefix("builtin:")).function()
        return (model, *_load.synthesize(model, 0))
    return globals()[name]()
