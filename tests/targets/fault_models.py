"""TARGETs that exit, hang, run long or return data tfdet cannot train on.

Each is tiny: the tests that use them spawn `tfdet` and must stay cheap.
"""

from __future__ import annotations

import os
import sys
import time

import keras
import numpy as np


def _model(loss: str | None = "mse") -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss=loss)
    return model


def _xy(samples: int = 64, features: int = 8, labels: int | None = None):
    rng = np.random.default_rng(0)
    return (
        rng.random((samples, features), dtype=np.float32),
        rng.random((samples if labels is None else labels, 1), dtype=np.float32),
    )


def good() -> keras.Model:
    return _model()


def exits_zero() -> keras.Model:
    sys.exit(0)


def os_exits_zero() -> keras.Model:
    os._exit(0)


def hangs() -> keras.Model:
    time.sleep(3600)
    return _model()


def no_loss() -> keras.Model:
    return _model(loss=None)


def wrong_input_shape() -> tuple:
    return (_model(), *_xy(features=5))


def length_mismatch() -> tuple:
    return (_model(), *_xy(labels=32))


def zero_samples() -> tuple:
    return (_model(), *_xy(samples=0))


def strings_as_data() -> tuple:
    return _model(), "x", "y"


def tf_dataset() -> tuple:
    import tensorflow as tf

    x, y = _xy()
    return _model(), tf.data.Dataset.from_tensor_slices((x, y)).batch(16), None


def tf_dataset_weighted() -> tuple:
    import tensorflow as tf

    x, y = _xy()
    weights = np.linspace(0.5, 1.5, len(x)).astype(np.float32)
    return _model(), tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(16)


def tf_dataset_without_labels() -> tuple:
    import tensorflow as tf

    x, _ = _xy()
    return _model(), tf.data.Dataset.from_tensor_slices(x).batch(16), None


class _Batches(keras.utils.PyDataset):
    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = _xy()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple:
        return self.x[index * 16 : (index + 1) * 16], self.y[
            index * 16 : (index + 1) * 16
        ]


def py_dataset() -> tuple:
    return _model(), _Batches()
