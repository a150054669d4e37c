"""TARGETs for the `tfdet check` tests: broken and nondeterministic ones."""

from __future__ import annotations

import os
import sys
import time

import keras
import numpy as np


class UrandomNoise(keras.layers.Layer):
    """Adds noise drawn from os.urandom: different in every process."""

    def call(self, inputs):
        noise = np.frombuffer(os.urandom(4), dtype=np.uint32)[0] / 2**32 * 1e-3
        return inputs + noise


class CrashWhenTraining(keras.layers.Layer):
    """Builds fine, raises at the first training step."""

    def call(self, inputs, training=None):
        if training:
            raise RuntimeError("boom: this layer refuses to train")
        return inputs


def _dense_model(*middle: keras.layers.Layer) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            *middle,
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def urandom_model() -> keras.Model:
    # Keras traces `call` once per process, so the noise is a constant of the
    # graph: fixed within a process, different between processes.
    return _dense_model(UrandomNoise())


def crash_model() -> keras.Model:
    return _dense_model(CrashWhenTraining())


def _in_a_check_run() -> bool:
    """Whether this process is one of a check's runs (not scan's preflight)."""
    child = os.path.join("tfdet", "_child", "__main__.py")
    return sys.argv[0].endswith(child) and '"kind": "check"' in sys.argv[1]


class SleepWhenTraining(keras.layers.Layer):
    """Builds fine, then sleeps in the first training step: the run times out."""

    def call(self, inputs, training=None):
        if training:
            time.sleep(600)
        return inputs


def sleepy_model() -> keras.Model:
    return _dense_model(SleepWhenTraining())


def not_a_model() -> str:
    return "I am not a model"


def uncompiled_model() -> keras.Model:
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])


def with_data() -> tuple:
    rng = np.random.default_rng(0)
    return (
        _dense_model(),
        rng.random((64, 8), dtype=np.float32),
        rng.random((64, 1), dtype=np.float32),
    )


def crash_on_one_cpu() -> keras.Model:
    """Dies with garbage on stdout when a check worker runs on a single CPU.

    Only one of two affinity-perturbed runs fails: the other must not be
    reported as "identical" to nothing.
    """
    if _in_a_check_run() and len(os.sched_getaffinity(0)) == 1:
        sys.stdout.buffer.write(b"\xff\xfe not utf-8 \xff\n")
        sys.stdout.flush()
        os._exit(17)
    return _dense_model()


def wide_mlp() -> tuple:
    """Two Dense(256) layers on 256 samples, Adam: without tfdet its bits
    follow the core count on aarch64 (Eigen's products split over the pool;
    measured under QEMU), and a run costs there far less than the built-in
    CNN's convolutions."""
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256)).astype("float32")
    y = np.eye(10, dtype="float32")[rng.integers(0, 10, 256)]
    return model, x, y
