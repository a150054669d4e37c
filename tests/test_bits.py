"""Bit views: exact patterns, ulp distances, checksums that see every bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdet import _bits

# Imported before hypothesis runs: TensorFlow raises the recursion limit on
# import, which hypothesis warns about when it happens inside a test.
tf = pytest.importorskip("tensorflow")


def test_value_bits_keeps_dtype_and_pattern():
    assert _bits.value_bits(np.float32(1.0)) == {
        "dtype": "float32",
        "bits": "3f800000",
        "value": "1.0",
    }
    assert _bits.value_bits(1.0)["bits"] == "3ff0000000000000"


def test_negative_zero_and_zero_have_different_bits_but_no_ulps():
    neg, pos = _bits.value_bits(np.float32(-0.0)), _bits.value_bits(np.float32(0.0))
    assert neg["bits"] != pos["bits"]
    assert _bits.ulp_distance(neg, pos) == 0


def test_logged_python_floats_become_float32_when_exact():
    assert _bits.logged_value_bits(float(np.float32(0.1)))["dtype"] == "float32"
    assert _bits.logged_value_bits(0.1)["dtype"] == "float64"


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_next_float_is_one_ulp_away(x):
    x = np.float32(x)
    nxt = np.nextafter(x, np.float32(np.inf))
    assert _bits.ulp_distance(_bits.value_bits(x), _bits.value_bits(nxt)) == 1


def test_ulp_distance_is_none_across_dtypes():
    assert (
        _bits.ulp_distance(_bits.value_bits(np.float32(1)), _bits.value_bits(1.0))
        is None
    )


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(0, 31),
    st.sampled_from([np.float32, np.float16, np.float64, np.int32]),
)
def test_device_checksum_sees_any_single_flipped_bit(seed, bit, dtype):
    rng = np.random.default_rng(seed)
    value = (rng.standard_normal((7, 5)) * 100).astype(dtype)
    width = value.dtype.itemsize * 8
    flipped = value.copy()
    index = seed % value.size
    flipped.view(f"u{value.dtype.itemsize}").ravel()[index] ^= np.array(
        1 << (bit % width)
    ).astype(f"u{value.dtype.itemsize}")
    a = _bits.device_checksums([tf.constant(value)])
    b = _bits.device_checksums([tf.constant(flipped)])
    assert not np.array_equal(a, b)


def test_device_checksum_sees_swapped_elements():
    value = np.arange(12, dtype=np.float32)
    swapped = value.copy()
    swapped[[2, 9]] = swapped[[9, 2]]
    a = _bits.device_checksums([tf.constant(value)])
    b = _bits.device_checksums([tf.constant(swapped)])
    assert a[0, 0] == b[0, 0] and a[0, 1] != b[0, 1]


def test_array_digest_depends_on_shape_and_dtype():
    x = np.zeros(4, np.float32)
    assert _bits.array_digest(x) != _bits.array_digest(x.reshape(2, 2))
    assert _bits.array_digest(x) != _bits.array_digest(x.view(np.int32))
