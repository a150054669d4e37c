"""Exact bit views of numbers and weights: hex patterns, ulps, fingerprints.

Determinism is judged on bit patterns, never on `==` of floats (0.0 == -0.0,
NaN != NaN) and never with a tolerance.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_UINT_FOR_WIDTH = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def value_bits(value: Any) -> dict[str, str]:
    """A scalar as `{"dtype": ..., "bits": hex, "value": repr}`.

    Python floats are recorded as float64; NumPy and TensorFlow scalars keep
    their dtype, so float32 losses compare as float32.
    """
    array = np.asarray(value)
    if array.dtype == object or array.size != 1:
        raise ValueError(
            f"Expected a numeric scalar. Received: {value!r} (shape {array.shape})"
        )
    array = array.reshape(())
    raw = array.tobytes()
    return {
        "dtype": array.dtype.name,
        "bits": raw[::-1].hex() if np.little_endian else raw.hex(),
        "value": repr(array.item()),
    }


def logged_value_bits(value: Any) -> dict[str, str]:
    """`value_bits` of a logged loss or metric, narrowed to float32 when exact.

    Keras returns float32 losses and metrics as Python floats. Recording them
    as float32 (they convert back exactly) keeps ulp distances in the units
    of the computation instead of float64's.
    """
    if isinstance(value, float):
        narrowed = np.float32(value)
        if float(narrowed) == value or value != value:  # exact, or NaN
            return value_bits(narrowed)
    return value_bits(value)


def _ordered_int(bits_hex: str, width: int) -> int:
    """Maps a float bit pattern to an integer whose order is the float order."""
    as_int = int(bits_hex, 16)
    sign = 1 << (8 * width - 1)
    # Sign-magnitude to a signed integer line: -0.0 and +0.0 both map to 0.
    return -(as_int & (sign - 1)) if as_int & sign else as_int


def ulp_distance(a: dict[str, str], b: dict[str, str]) -> int | None:
    """Units in the last place between two `value_bits` floats, or None.

    None when the dtypes differ or are not floating point.
    """
    if a["dtype"] != b["dtype"] or not np.issubdtype(np.dtype(a["dtype"]), np.floating):
        return None
    width = np.dtype(a["dtype"]).itemsize
    return abs(_ordered_int(a["bits"], width) - _ordered_int(b["bits"], width))


def array_digest(array: Any) -> str:
    """SHA-256 of an array's dtype, shape and bytes (host side, exact)."""
    array = np.ascontiguousarray(np.asarray(array))
    digest = hashlib.sha256()
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def weights_digests(variables: Sequence[Any]) -> dict[str, str]:
    """`{variable path: array_digest}` for every variable (copies to host)."""
    return {
        _variable_name(v, i): array_digest(np.asarray(v))
        for i, v in enumerate(variables)
    }


def combined_digest(digests: Iterable[str]) -> str:
    """One SHA-256 over many digests, in order."""
    digest = hashlib.sha256()
    for item in digests:
        digest.update(item.encode())
    return digest.hexdigest()


def _variable_name(variable: Any, index: int) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None)
    return f"{index}:{name}"


_checksum_fn = None


def device_checksums(variables: Sequence[Any]) -> np.ndarray:
    """Two 32-bit checksums per variable, computed where the variable lives.

    Each variable's bit pattern is reinterpreted as unsigned integers and
    reduced twice with wrap-around addition: a plain sum (any single flipped
    bit changes it by +-2**k, never 0 mod 2**32) and a sum weighted by odd
    position factors (catches swapped elements). Integer addition is
    associative, so the reduction order, and thus the thread count, cannot
    change the result. Only 8 bytes per variable leave the device.

    Returns:
        A uint32 array of shape (len(variables), 2).
    """
    global _checksum_fn
    import tensorflow as tf

    if _checksum_fn is None:

        def one(value: tf.Tensor) -> tf.Tensor:
            flat = tf.reshape(value, [-1])
            width = flat.dtype.size
            if flat.dtype.is_bool:
                words = tf.cast(flat, tf.uint32)
            elif width == 8:
                words = tf.reshape(tf.bitcast(flat, tf.uint32), [-1])
            elif width == 4:
                words = tf.bitcast(flat, tf.uint32)
            elif width == 2:
                words = tf.cast(tf.bitcast(flat, tf.uint16), tf.uint32)
            else:
                words = tf.cast(tf.bitcast(flat, tf.uint8), tf.uint32)
            positions = tf.range(tf.size(words, out_type=tf.int32), dtype=tf.int32)
            odd = tf.cast(positions, tf.uint32) * 2 + 1
            return tf.stack([tf.reduce_sum(words), tf.reduce_sum(words * odd)])

        @tf.autograph.experimental.do_not_convert
        def checksums(values):
            return tf.stack([one(value) for value in values])

        _checksum_fn = tf.function(checksums, reduce_retracing=True)
    if not variables:
        return np.zeros((0, 2), dtype=np.uint32)
    values = [
        v.value if hasattr(v, "value") and not callable(v.value) else v
        for v in variables
    ]
    return np.asarray(_checksum_fn([tf.convert_to_tensor(v) for v in values]))
