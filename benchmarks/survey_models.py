"""The op survey: one small model per piece of common Keras training.

`portability.py` trains each under the default profile and records its
weights digest per machine (`survey:NAME` in `portability_digests.json`), so
two real machines say, piece by piece, which ones keep their bits: the
normalizations, activations, losses, optimizers with each Keras schedule,
pooling, Embedding, Dropout, attention, recurrent layers, the
`mixed_bfloat16` policy and a shuffled, mapped `tf.data` pipeline. Each model
isolates its piece behind a Dense or Conv2D (whose kernels were already shown
equal on an AMD EPYC and an Intel Xeon) and trains with SGD unless the piece
is the optimizer.

Every function returns `(model, x, y)` or `(model, dataset)`; `NAMES` lists
them in the order the table shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

SAMPLES = 32
CLASSES = 4


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _images() -> np.ndarray:
    return _rng().standard_normal((SAMPLES, 8, 8, 3)).astype("float32")


def _vectors(width: int = 16) -> np.ndarray:
    return _rng().standard_normal((SAMPLES, width)).astype("float32")


def _sequences() -> np.ndarray:
    return _rng().standard_normal((SAMPLES, 10, 8)).astype("float32")


def _labels() -> np.ndarray:
    return _rng().integers(0, CLASSES, SAMPLES)


def _compiled(model: Any, optimizer: Any = "sgd", loss: Any = None) -> Any:
    import keras

    model.compile(
        optimizer=optimizer,
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _head(*layers: Any, inputs: tuple[int, ...] = (16,)) -> Any:
    """`layers` between an Input and a Dense logits layer."""
    import keras

    return keras.Sequential([keras.Input(inputs), *layers, keras.layers.Dense(CLASSES)])


# --- Normalization. ---


def batch_norm_train():
    import keras

    L = keras.layers
    model = _head(L.Conv2D(4, 3), L.BatchNormalization(), L.Flatten(), inputs=(8, 8, 3))
    return _compiled(model), _images(), _labels()


def batch_norm_inference():
    """A frozen BatchNormalization: Keras 3 then normalizes with moving stats."""
    import keras

    L = keras.layers
    frozen = L.BatchNormalization()
    frozen.trainable = False
    model = _head(L.Conv2D(4, 3), frozen, L.Flatten(), inputs=(8, 8, 3))
    return _compiled(model), _images(), _labels()


def layer_norm():
    import keras

    L = keras.layers
    model = _head(L.Dense(16), L.LayerNormalization())
    return _compiled(model), _vectors(), _labels()


# --- Activations. ---


def _activation(activation: Any):
    import keras

    model = _head(keras.layers.Dense(16, activation=activation))
    return _compiled(model), _vectors(), _labels()


def gelu_exact():
    return _activation("gelu")  # Keras 3: approximate=False (erf/erfc).


def gelu_tanh():
    import keras

    return _activation(lambda x: keras.activations.gelu(x, approximate=True))


def softmax():
    return _activation("softmax")


def sigmoid():
    return _activation("sigmoid")


def tanh():
    return _activation("tanh")


# --- Losses. ---


def categorical_crossentropy():
    import keras

    model = _head(keras.layers.Dense(16), keras.layers.Softmax())
    y = keras.utils.to_categorical(_labels(), CLASSES)
    return (
        _compiled(model, loss=keras.losses.CategoricalCrossentropy()),
        _vectors(),
        y,
    )


def sparse_categorical_crossentropy_logits():
    import keras

    return _compiled(_head(keras.layers.Dense(16))), _vectors(), _labels()


def binary_crossentropy():
    import keras

    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(1, activation="sigmoid")]
    )
    y = (_labels() % 2).astype("float32")[:, None]
    return _compiled(model, loss=keras.losses.BinaryCrossentropy()), _vectors(), y


# --- Optimizers and schedules. ---


def _optimizer(optimizer: Any):
    import keras

    model = _head(keras.layers.Dense(16, activation="relu"))
    return _compiled(model, optimizer=optimizer), _vectors(), _labels()


def adam():
    import keras

    return _optimizer(keras.optimizers.Adam(1e-2))


def adamw():
    import keras

    return _optimizer(keras.optimizers.AdamW(1e-2, weight_decay=1e-2))


def rmsprop():
    import keras

    return _optimizer(keras.optimizers.RMSprop(1e-2))


def sgd_nesterov_momentum():
    import keras

    return _optimizer(keras.optimizers.SGD(1e-2, momentum=0.9, nesterov=True))


def _scheduled(schedule: Any):
    import keras

    return _optimizer(keras.optimizers.Adam(schedule))


def schedule_exponential_decay():
    import keras

    return _scheduled(keras.optimizers.schedules.ExponentialDecay(1e-2, 3, 0.7))


def schedule_inverse_time_decay():
    import keras

    return _scheduled(keras.optimizers.schedules.InverseTimeDecay(1e-2, 3, 0.7))


def schedule_polynomial_decay():
    import keras

    return _scheduled(
        keras.optimizers.schedules.PolynomialDecay(1e-2, 10, 1e-4, power=1.5)
    )


def schedule_piecewise_constant():
    import keras

    return _scheduled(
        keras.optimizers.schedules.PiecewiseConstantDecay([1, 2], [1e-2, 5e-3, 1e-3])
    )


def schedule_cosine_decay_warmup():
    import keras

    return _scheduled(
        keras.optimizers.schedules.CosineDecay(
            1e-3, 10, warmup_target=1e-2, warmup_steps=2
        )
    )


def schedule_cosine_decay_restarts():
    import keras

    return _scheduled(keras.optimizers.schedules.CosineDecayRestarts(1e-2, 2))


# --- Layers. ---


def pooling():
    import keras

    L = keras.layers
    model = _head(
        L.Conv2D(4, 3, padding="same"),
        L.MaxPooling2D(2),
        L.AveragePooling2D(2),
        L.GlobalAveragePooling2D(),
        inputs=(8, 8, 3),
    )
    return _compiled(model), _images(), _labels()


def embedding():
    import keras

    L = keras.layers
    model = _head(L.Embedding(50, 8), L.GlobalAveragePooling1D(), inputs=(10,))
    tokens = _rng().integers(0, 50, (SAMPLES, 10))
    return _compiled(model), tokens, _labels()


def dropout():
    import keras

    L = keras.layers
    model = _head(L.Dense(16), L.Dropout(0.5))
    return _compiled(model), _vectors(), _labels()


def multi_head_attention():
    import keras

    L = keras.layers
    inputs = keras.Input((10, 8))
    attended = L.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    outputs = L.Dense(CLASSES)(L.GlobalAveragePooling1D()(attended))
    return _compiled(keras.Model(inputs, outputs)), _sequences(), _labels()


def lstm():
    import keras

    return (
        _compiled(_head(keras.layers.LSTM(8), inputs=(10, 8))),
        _sequences(),
        _labels(),
    )


def gru():
    import keras

    return (
        _compiled(_head(keras.layers.GRU(8), inputs=(10, 8))),
        _sequences(),
        _labels(),
    )


def mixed_bfloat16():
    """Conv2D + Dense under the `mixed_bfloat16` policy (bf16 compute)."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    L = keras.layers
    model = _head(L.Conv2D(4, 3), L.Flatten(), L.Dense(16), inputs=(8, 8, 3))
    return _compiled(model), _images(), _labels()


def tf_data_shuffle_map():
    """A seeded shuffle and a parallel map in the input pipeline."""
    import keras
    import tensorflow as tf

    dataset = (
        tf.data.Dataset.from_tensor_slices((_vectors(), _labels()))
        .shuffle(SAMPLES, seed=1)
        .map(lambda x, y: (tf.tanh(x) * 2.0, y), num_parallel_calls=4)
        .batch(8)
    )
    return _compiled(_head(keras.layers.Dense(16))), dataset


NAMES: dict[str, Callable[[], Any]] = {
    function.__name__: function
    for function in (
        batch_norm_train,
        batch_norm_inference,
        layer_norm,
        gelu_exact,
        gelu_tanh,
        softmax,
        sigmoid,
        tanh,
        categorical_crossentropy,
        sparse_categorical_crossentropy_logits,
        binary_crossentropy,
        adam,
        adamw,
        rmsprop,
        sgd_nesterov_momentum,
        schedule_exponential_decay,
        schedule_inverse_time_decay,
        schedule_polynomial_decay,
        schedule_piecewise_constant,
        schedule_cosine_decay_warmup,
        schedule_cosine_decay_restarts,
        pooling,
        embedding,
        dropout,
        multi_head_attention,
        lstm,
        gru,
        mixed_bfloat16,
        tf_data_shuffle_map,
    )
}
