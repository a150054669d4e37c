"""A tiny model compiled with jit_compile=True (for the XLA notice)."""

import keras


def jit_dense():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model
