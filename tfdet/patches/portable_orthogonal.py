"""Keras 3's `Orthogonal` initializer with the same bits on x86-64 and aarch64.

The recurrent kernels of `LSTM`, `GRU` and `SimpleRNN` (and any layer given
`"orthogonal"`) start as the Q of a QR factorization of a seeded normal
matrix. Keras computes it with `tf.linalg.qr` (TensorFlow's `Qr`: Eigen's
Householder QR, whose dot products and norms add in the vector unit's
order), so the same seed gives an LSTM other starting weights on an ARM
CPU than on an x86 one (measured under QEMU's aarch64 emulation: the
recurrent kernel differs, every other weight is equal).

Here the same normal matrix is orthonormalized by classical Gram-Schmidt,
twice per column (so that Q is orthonormal to float32's rounding, as
Householder's is), from TensorFlow ops that the default profile computes
portably (the fixed-order products and sums, a correctly rounded square
root and division). Q with a positive diagonal of R is the unique one that
Keras's own sign fix gives, so the initializer's values are Keras's to
rounding; its bits are the same on both architectures where those patches
are installed.

Other dtypes and backends keep Keras's own; a matrix of more than
`LARGEST` columns too (the columns are taken one at a time).
"""

from __future__ import annotations

import math
from typing import Any

from tfdet._patching._registry import KERAS3, Patch
from tfdet._patching._swap import Swap

# Columns orthonormalized one at a time: a matrix past this many keeps
# Keras's own QR (its time grows with the columns squared).
LARGEST = 2048


def orthonormal_columns(a: Any) -> Any:
    """Q (m x n, orthonormal columns, R's diagonal positive) of a float32 `a`
    of m >= n rows, by Gram-Schmidt with one reorthogonalization."""
    import tensorflow as tf

    columns = a.shape[1]
    q = tf.zeros([a.shape[0], 0], a.dtype)
    for j in range(columns):
        v = a[:, j : j + 1]
        for _ in range(2 if j else 0):
            v = v - tf.matmul(q, tf.matmul(q, v, transpose_a=True))
        v = v / tf.sqrt(tf.reduce_sum(v * v))
        q = tf.concat([q, v], axis=1)
    return q


def _apply(swap: Swap) -> None:
    import keras
    from keras.src import random
    from keras.src.backend import standardize_dtype

    if keras.config.backend() != "tensorflow":
        return
    # The class itself (named OrthogonalInitializer before Keras 3.9 or so).
    initializer = keras.initializers.Orthogonal
    original = initializer.__call__

    def __call__(self: Any, shape: Any, dtype: Any = None) -> Any:
        import tensorflow as tf

        dtype = standardize_dtype(dtype)
        rows, columns = math.prod(shape[:-1]), shape[-1]
        if dtype != "float32" or len(shape) < 2 or min(rows, columns) > LARGEST:
            return original(self, shape, dtype=dtype)
        # Keras's own steps (its Orthogonal.__call__), its QR aside.
        flat_shape = (max(columns, rows), min(columns, rows))
        a = random.normal(flat_shape, seed=self.seed, dtype=dtype)
        q = orthonormal_columns(tf.convert_to_tensor(a))
        if rows < columns:
            q = tf.transpose(q)
        return self.gain * tf.reshape(q, shape)

    swap.attribute(initializer, "__call__", __call__)


PATCH = Patch(
    summary="Keras 3's Orthogonal initializer (tf.linalg.qr: Eigen's Householder, "
    "architecture-dependent sums) -> Gram-Schmidt over the portable products "
    "and sums",
    upstream="https://github.com/keras-team/keras/blob/master/keras/src/initializers/random_initializers.py",
    apply=_apply,
    requires=KERAS3,
    cpu_only=True,
)
