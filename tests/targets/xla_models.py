"""Tiny models compiled with jit_compile=True (XLA under determinism)."""

import keras


def _jit(*layers):
    """A Sequential model of `layers`, compiled with jit_compile=True."""
    model = keras.Sequential(list(layers))
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    return model


def jit_dense():
    return _jit(keras.Input((4,)), keras.layers.Dense(2))


def jit_max_pool():
    """MaxPooling2D + Dense: XLA under determinism once its gradient is patched."""
    return _jit(
        keras.Input((8, 8, 2)),
        keras.layers.Conv2D(3, 3, padding="same"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    )


def jit_max_pool_3d():
    """MaxPooling3D: no deterministic XLA gradient under tfdet, so Keras drops XLA."""
    return _jit(
        keras.Input((4, 4, 4, 1)),
        keras.layers.MaxPooling3D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    )


def jit_conv_max_pool_3d():
    """Conv3D before MaxPooling3D: the step needs MaxPool3DGrad, which XLA
    cannot compile deterministically, so Keras drops jit_compile=True."""
    return _jit(
        keras.Input((4, 4, 4, 1)),
        keras.layers.Conv3D(2, 3, padding="same"),
        keras.layers.MaxPooling3D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    )
