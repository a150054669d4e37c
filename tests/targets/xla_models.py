"""Tiny models compiled with jit_compile=True (XLA under determinism)."""

import keras


def jit_dense():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model


def jit_max_pool():
    """MaxPooling2D + Dense: XLA under determinism once its gradient is patched."""
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(3, 3, padding="same"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model


def jit_max_pool_3d():
    """MaxPooling3D: no deterministic XLA gradient under tfdet, so Keras drops XLA."""
    model = keras.Sequential(
        [
            keras.Input((4, 4, 4, 1)),
            keras.layers.MaxPooling3D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model


def jit_conv_max_pool_3d():
    """Conv3D before MaxPooling3D: the step needs MaxPool3DGrad, which XLA
    cannot compile deterministically, so Keras drops jit_compile=True."""
    model = keras.Sequential(
        [
            keras.Input((4, 4, 4, 1)),
            keras.layers.Conv3D(2, 3, padding="same"),
            keras.layers.MaxPooling3D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model
