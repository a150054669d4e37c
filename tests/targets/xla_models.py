"""Tiny models compiled with jit_compile=True (XLA under determinism)."""

import keras

# A script: the gradient of a MaxPool loss, compiled with XLA under
# `tfdet.enable(patches=PATCHES)` on DEVICE (both replaced by the caller with
# Python literals). Prints `{"bits": sha256}` or, when TensorFlow or XLA
# refuses it, `{"error": type, "message": text}`; any other exception is a
# failure of the script itself.
MAX_POOL_XLA_GRADIENT = """
import hashlib, json
import numpy as np
import tfdet
tfdet.enable(seed=0, patches=PATCHES)
import tensorflow as tf
x = tf.constant(np.random.default_rng(0).standard_normal((8, 32, 32, 16)), tf.float32)

@tf.function(jit_compile=True)
def gradient(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.nn.max_pool2d(x, 3, 2, "SAME")
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, x)

try:
    with tf.device(DEVICE):
        bits = hashlib.sha256(gradient(x).numpy().tobytes()).hexdigest()
    print(json.dumps({"bits": bits}))
except tf.errors.OpError as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)[:500]}))
"""


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
