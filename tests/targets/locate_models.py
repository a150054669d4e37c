"""TARGETs for `tfdet locate` tests: a nondeterministic layer mid-stack.

`UrandomNoise` adds noise from `os.urandom`, which no seed controls: two
processes trace it with different constants, so its output, and everything
after it, differs, while every layer before it agrees bit for bit. It sits
in the middle of a Sequential, inside a nested block of a functional model,
and inside a subclassed model. `clean_*` variants replace it by an identity.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np

FEATURES = 16


@keras.saving.register_keras_serializable(package="tfdet_tests")
class UrandomNoise(keras.layers.Layer):
    """Adds 1e-3-scale noise drawn from `os.urandom` at trace time."""

    def __init__(self, noisy: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.noisy = noisy

    def call(self, inputs: Any) -> Any:
        if not self.noisy:
            return inputs
        width = int(inputs.shape[-1])
        raw = np.frombuffer(os.urandom(4 * width), dtype=np.uint32)
        noise = (raw.astype(np.float64) / 2**32 * 1e-3).astype(np.float32)
        return inputs + keras.ops.convert_to_tensor(noise)


def _compile(model: Any) -> Any:
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _data(count: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((count, FEATURES)).astype(np.float32)
    y = rng.standard_normal((count, 4)).astype(np.float32)
    return x, y


def _sequential(noisy: bool) -> Any:
    return _compile(
        keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(32, activation="relu", name="dense_a"),
                keras.layers.Dense(32, activation="tanh", name="dense_b"),
                UrandomNoise(noisy, name="urandom_noise"),
                keras.layers.Dense(16, activation="relu", name="dense_c"),
                keras.layers.Dense(4, name="head"),
            ],
            name="stack",
        )
    )


def urandom_sequential() -> Any:
    """Sequential: Dense, Dense, UrandomNoise, Dense, Dense."""
    return _sequential(True)


def clean_sequential() -> Any:
    """The same Sequential without noise (deterministic)."""
    return _sequential(False)


def urandom_functional() -> Any:
    """Functional model with a nested Sequential block holding the noise."""
    inputs = keras.Input((FEATURES,))
    x = keras.layers.Dense(32, activation="relu", name="dense_a")(inputs)
    block = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(32, activation="relu", name="inner_dense"),
            UrandomNoise(name="inner_noise"),
            keras.layers.Dense(32, activation="relu", name="inner_after"),
        ],
        name="block",
    )
    x = block(x)
    outputs = keras.layers.Dense(4, name="head")(x)
    return _compile(keras.Model(inputs, outputs, name="functional_nested"))


def clean_residual() -> Any:
    """Functional residual block: dense_a feeds both dense_b and the add."""
    inputs = keras.Input((FEATURES,))
    a = keras.layers.Dense(32, activation="relu", name="dense_a")(inputs)
    b = keras.layers.Dense(32, activation="tanh", name="dense_b")(a)
    added = keras.layers.Add(name="add")([a, b])
    outputs = keras.layers.Dense(4, name="head")(added)
    return _compile(keras.Model(inputs, outputs, name="residual"))


class _Subclassed(keras.Model):
    def __init__(self, noisy: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first = keras.layers.Dense(32, activation="relu", name="first")
        self.noise = UrandomNoise(noisy, name="sub_noise")
        self.second = keras.layers.Dense(16, activation="relu", name="second")
        self.head = keras.layers.Dense(4, name="head")

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.head(self.second(self.noise(self.first(inputs))))


def urandom_subclassed() -> Any:
    """Subclassed model (not built until called): returns (model, x, y)."""
    return (_compile(_Subclassed(name="subclassed")), *_data())


class _OwnStep(keras.Model):
    """A model whose `train_step` is its own (here: it halves every gradient)."""

    def train_step(self, data: Any) -> dict[str, Any]:
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(
            [
                (g * 0.5, v)
                for g, v in zip(gradients, self.trainable_variables, strict=True)
            ]
        )
        return {"loss": loss}


def custom_train_step() -> Any:
    """A functional model with its own `train_step`, which locate cannot replay."""
    inputs = keras.Input((FEATURES,))
    outputs = keras.layers.Dense(4, name="head")(inputs)
    model = _compile(_OwnStep(inputs, outputs))
    x, y = _data()
    return model, x, y
