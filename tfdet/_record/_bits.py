"""Exact bit views of numbers and weights: hex patterns, ulps, fingerprints.

Determinism is judged on bit patterns, never on `==` of floats (0.0 == -0.0,
NaN != NaN) and never with a tolerance.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


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
    of the computation instead of float64's. A metric that logs an array
    (e.g. per-class values) is recorded by its exact digest: `"bits"` is the
    `array_digest`, `"value"` is `"array"` and `"shape"` its shape.
    """
    if isinstance(value, float):
        narrowed = np.float32(value)
        if float(narrowed) == value or value != value:  # exact, or NaN
            return value_bits(narrowed)
    array = np.asarray(value)
    if array.size == 1 and array.dtype != object:
        return value_bits(value)
    return {
        "dtype": array.dtype.name,
        "bits": array_digest(array),
        "value": "array",
        "shape": list(array.shape),
    }


def show(bits: Mapping[str, Any] | None) -> str:
    """A recorded value for people: `value [dtype 0xBITS]`, `(absent)` for None.

    The one way tfdet shows a value's bits (reports, errors, `tfdet diff`).
    An array metric shows its shape and digest.
    """
    if bits is None:
        return "(absent)"
    if "shape" in bits:
        return f"array{tuple(bits['shape'])} [{bits.get('dtype')} sha256 {bits.get('bits')}]"
    return f"{bits.get('value')} [{bits.get('dtype')} 0x{bits.get('bits')}]"


def is_finite(bits: Mapping[str, Any]) -> bool | None:
    """Whether a recorded scalar float is finite; None when not a float scalar."""
    if "shape" in bits:
        return None
    try:
        dtype = np.dtype(bits["dtype"])
        if not np.issubdtype(dtype, np.floating):
            return None
        raw = bytes.fromhex(bits["bits"])
        value = np.frombuffer(raw[::-1] if np.little_endian else raw, dtype)[0]
    except (KeyError, TypeError, ValueError):
        return None
    return bool(np.isfinite(value))


def _ordered_int(bits_hex: str, width: int) -> int:
    """Maps a float bit pattern to an integer whose order is the float order."""
    as_int = int(bits_hex, 16)
    sign = 1 << (8 * width - 1)
    # Sign-magnitude to a signed integer line: -0.0 and +0.0 both map to 0.
    return -(as_int & (sign - 1)) if as_int & sign else as_int


def ulp_distance(a: dict[str, str], b: dict[str, str]) -> int | None:
    """Units in the last place between two `value_bits` floats, or None.

    None when the dtypes differ or are not floating point, or for arrays.
    """
    if a["dtype"] != b["dtype"] or not np.issubdtype(np.dtype(a["dtype"]), np.floating):
        return None
    width = np.dtype(a["dtype"]).itemsize
    if "shape" in a or "shape" in b or {len(a["bits"]), len(b["bits"])} != {2 * width}:
        return None
    return abs(_ordered_int(a["bits"], width) - _ordered_int(b["bits"], width))


def array_digest(array: Any) -> str:
    """SHA-256 of an array's dtype, shape and bytes (host side, exact)."""
    array = np.ascontiguousarray(np.asarray(array))
    digest = hashlib.sha256()
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def variable_names(variables: Sequence[Any]) -> list[str]:
    """One unambiguous name per variable: `"{index}:{path or name}"`.

    The index keeps names unique when a framework repeats them (tf_keras
    names are not unique across layers) and says where each fingerprint sits
    in the weights list. Every trace and worker result uses these names.
    """
    return [
        f"{index}:{getattr(v, 'path', None) or getattr(v, 'name', None)}"
        for index, v in enumerate(variables)
    ]


def weights_digests(variables: Sequence[Any], values: Sequence[Any]) -> dict[str, str]:
    """`{variable_names(...) name: array_digest}` for every variable.

    Args:
        variables: The variables, for their names (e.g. `model.weights`).
        values: Their host copies in the same order. `model.get_weights()`
            gives them in eager and in `tf.compat.v1` graph mode alike, where
            reading a variable with NumPy is not possible.
    """
    return {
        name: array_digest(np.asarray(value))
        for name, value in zip(variable_names(variables), values, strict=True)
    }


def checksum_hex(checksums: Any) -> list[str]:
    """`device_checksums` rows as 16 hex digits each (the two words in order)."""
    return [f"{int(a):08x}{int(b):08x}" for a, b in np.asarray(checksums, np.uint32)]


def host_checksums(arrays: Sequence[Any]) -> np.ndarray:
    """`(n, 2)` uint32 checksums from host arrays: the first 8 bytes of SHA-256.

    For tf.compat.v1 graph mode, which has no eager `tf.function` to run
    `device_checksums`: same layout, different values.
    """
    rows = []
    for array in arrays:
        digest = array_digest(array)
        rows.append([int(digest[:8], 16), int(digest[8:16], 16)])
    return np.array(rows, dtype=np.uint32).reshape(len(rows), 2)


def weight_checksums(variables: Sequence[Any]) -> np.ndarray:
    """`(n, 2)` uint32 checksums of `variables`, on device when eager.

    Eager TensorFlow 2 (Keras 3, tf_keras): `device_checksums`. tf.compat.v1
    graph mode (tf_keras only; Keras 3 has no graph mode): the values are
    read through tf_keras's session and digested on the host
    (`host_checksums`).
    """
    import tensorflow as tf

    variables = list(variables)
    if tf.executing_eagerly():
        return device_checksums(variables)
    import tf_keras

    return host_checksums(tf_keras.backend.batch_get_value(variables))


# Murmur3's 32-bit finalizer (fmix32) constants, and the two odd multipliers
# that give each element position its own key, one per checksum word.
_FMIX_MULTIPLIERS = (0x85EBCA6B, 0xC2B2AE35)
_POSITION_KEYS = (0x9E3779B9, 0x7FEB352D)

_xla_usable = True
# XLA compiles the checksums of a whole list of tensors into one pass, which
# pays once a process has spent as long in the plain functions as compiling
# takes: about 0.1 s of CPU a tensor (1.6 s for the built-in CNN's 12 weights,
# 25 s for ResNet-50's 320, a 2-core EPYC Zen 3), after which a call takes 7
# ms / 0.11 s against 12 ms / 0.28 s plain. Paying the plain price until it
# adds up to the compiling price (the ski-rental rule) costs at most twice the
# better choice made in hindsight: a run of a few steps never compiles, a long
# one compiles early.
XLA_SECONDS_PER_TENSOR = 0.1
_plain_seconds = 0.0


def _fmix32(h: Any) -> Any:
    """Murmur3 fmix32 on uint32 tensors: a bijection with full avalanche."""
    import tensorflow as tf

    xor, shift = tf.bitwise.bitwise_xor, tf.bitwise.right_shift
    h = xor(h, shift(h, tf.constant(16, tf.uint32)))
    h = h * tf.constant(_FMIX_MULTIPLIERS[0], tf.uint32)
    h = xor(h, shift(h, tf.constant(13, tf.uint32)))
    h = h * tf.constant(_FMIX_MULTIPLIERS[1], tf.uint32)
    return xor(h, shift(h, tf.constant(16, tf.uint32)))


def _words(value: Any) -> Any:
    """A tensor's bit pattern as a flat uint32 vector.

    4-byte elements are one word each, 8-byte elements two (each half with
    its own position), narrower ones are zero-extended, bool is 0 or 1.
    """
    import tensorflow as tf

    flat = tf.reshape(value, [-1])
    width = flat.dtype.size
    if flat.dtype.is_bool:
        return tf.cast(flat, tf.uint32)
    if width == 4:
        return tf.bitcast(flat, tf.uint32)
    if width % 4 == 0:
        return tf.reshape(tf.bitcast(flat, tf.uint32), [-1])
    if width == 2:
        return tf.cast(tf.bitcast(flat, tf.uint16), tf.uint32)
    return tf.reshape(tf.cast(tf.bitcast(flat, tf.uint8), tf.uint32), [-1])


def _checksum_pair(value: Any) -> Any:
    """`[sum(fmix32(w ^ i * K0)), sum(fmix32(w ^ i * K1))]` mod 2**32, uint32."""
    import tensorflow as tf

    words = _words(value)
    size = tf.size(words, out_type=tf.int32)
    # Positions count from 1, so that no element gets the key 0.
    positions = tf.bitcast(tf.range(1, size + 1, dtype=tf.int32), tf.uint32)
    sums = []
    for key in _POSITION_KEYS:
        keys = positions * tf.constant(key, tf.uint32)
        sums.append(tf.reduce_sum(_fmix32(tf.bitwise.bitwise_xor(words, keys))))
    return tf.stack(sums)


@functools.cache
def _pair_function(dtype: Any) -> Any:
    """The plain `_checksum_pair` of one tensor of `dtype`, as a `tf.function`.

    Traced once for every shape (its input has no static shape): the first
    call of a model's checksums traces one small graph per dtype, where a
    function of the whole list traced one graph of about twenty operations a
    tensor (ResNet-50: 6,400 operations, 19 s of CPU to trace and optimize
    before its first result). Integer arithmetic is exact, so every way of
    computing the checksums gives the same bits.
    """
    import tensorflow as tf

    return tf.function(
        tf.autograph.experimental.do_not_convert(_checksum_pair),
        input_signature=[tf.TensorSpec(None, dtype)],
    )


@functools.cache
def _compiled_function() -> Any:
    """The XLA-compiled checksums of a list of tensors, fused into one pass."""
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def checksums(values: list[Any]) -> Any:
        return tf.stack([_checksum_pair(value) for value in values])

    return tf.function(checksums, reduce_retracing=True, jit_compile=True)


def _plain_checksums(values: list[Any]) -> np.ndarray:
    import tensorflow as tf

    return np.asarray(tf.stack([_pair_function(v.dtype)(v) for v in values]))


def device_checksums(
    variables: Sequence[Any], *, xla: bool | None = None
) -> np.ndarray:
    """Two 32-bit checksums per variable, computed where the variable lives.

    Each variable's bit pattern is split into uint32 words; word `w` at
    position `i` (from 1) is hashed as `fmix32(w ^ (i * K))`, murmur3's
    finalizer, once with each of two odd keys `K`, and each checksum is the
    wrap-around sum of one of the two hashes. fmix32 is a bijection, so a
    change to any bits of one word always changes both sums; changes to
    several words cancel only if their pseudo-random hash differences happen
    to (about 2**-32 per word), unlike sums of the raw words, which miss
    e.g. +1, -2, +1 ulp at three positions or two sign flips. Integer
    addition is associative, so the reduction order, and thus the thread
    count, cannot change the result. Only 8 bytes per variable leave the
    device.

    Args:
        variables: Variables or tensors, of any numeric or bool dtype.
        xla: True compiles with XLA now (falling back to plain TensorFlow if
            XLA fails), False never does; None (the default) starts plain and
            compiles once the plain calls have taken `XLA_SECONDS_PER_TENSOR`
            for each of `variables` in this process. The result is the same
            either way.

    Returns:
        A uint32 array of shape (len(variables), 2).
    """
    import tensorflow as tf

    global _plain_seconds
    if not variables:
        return np.zeros((0, 2), dtype=np.uint32)
    values = [
        tf.convert_to_tensor(
            v.value if hasattr(v, "value") and not callable(v.value) else v
        )
        for v in variables
    ]
    if xla is None:
        xla = _plain_seconds >= XLA_SECONDS_PER_TENSOR * len(values)
    if xla and _xla_usable:
        try:
            return np.asarray(_compiled_function()(values))
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
            result = _plain_checksums(values)  # Raises if the input is bad.
            # The input is fine and XLA failed: no XLA here, from now on.
            _disable_xla()
            return result
    started = time.perf_counter()
    result = _plain_checksums(values)
    _plain_seconds += time.perf_counter() - started
    return result


def _disable_xla() -> None:
    global _xla_usable
    _xla_usable = False


def batch_checksum(data: Any) -> Any:
    """Two 32-bit checksums of every tensor of a batch, as a uint32 tensor [2].

    Runs inside the traced (and XLA-compiled) train step: each tensor of
    `data` (inputs, targets, sample weights; the components of ragged and
    sparse ones) gets its `_checksum_pair`, strings by their fingerprint64;
    the pairs and each tensor's shape are checksummed once more, in order,
    so that the same values in another tensor or shape differ too.
    """
    import tensorflow as tf

    rows = []
    for tensor in tf.nest.flatten(data, expand_composites=True):
        if tensor is None:
            continue
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype == tf.string:
            tensor = tf.strings.to_hash_bucket_fast(tensor, 2**63 - 1)
        shape = tf.bitcast(tf.shape(tensor, out_type=tf.int32), tf.uint32)
        rows.append(tf.concat([_checksum_pair(tensor), shape], axis=0))
    if not rows:
        return tf.zeros([2], tf.uint32)
    return _checksum_pair(tf.concat(rows, axis=0))
