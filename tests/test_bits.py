"""Bit views: exact patterns, ulp distances, checksums that see every bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdet._record import _bits


@pytest.fixture(autouse=True)
def xla_as_in_a_fresh_process(monkeypatch):
    """XLA usable, as a fresh process starts, and whatever a test finds out
    about it (`_bits._disable_xla`) undone after it: another test in this
    pytest worker must not inherit it (the rule of when to compile was seen
    failing so, in one order of the suite)."""
    monkeypatch.setattr(_bits, "_xla_usable", True)


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


_DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.int8]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(_DTYPES), st.data())
def test_device_checksum_sees_any_single_flipped_bit(seed, dtype, data):
    rng = np.random.default_rng(seed)
    value = (rng.standard_normal((7, 5)) * 100).astype(dtype)
    width = value.dtype.itemsize * 8
    # Every bit of the element, including the sign and exponent bits of the
    # upper 32-bit word of float64 and int64.
    bit = data.draw(st.integers(0, width - 1), label="bit")
    flipped = value.copy()
    index = seed % value.size
    unsigned = f"u{value.dtype.itemsize}"
    flipped.view(unsigned).ravel()[index] ^= np.array(1 << bit).astype(unsigned)
    a = _bits.device_checksums([tf.constant(value)])
    b = _bits.device_checksums([tf.constant(flipped)])
    # A single changed element changes both words.
    assert (a != b).all()


def _checksum(value: np.ndarray) -> np.ndarray:
    return _bits.device_checksums([tf.constant(value)])[0]


def test_device_checksum_sees_changes_that_cancel_in_linear_sums():
    weights = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    # +1, -2, +1 ulp at elements 10, 20, 30: the plain and the position-
    # weighted sums of the words both stay the same.
    ulps = weights.copy()
    ulps.view(np.uint32)[[10, 20, 30]] += np.array([1, -2, 1], np.int32).view(np.uint32)
    # Two sign flips: +2**31 twice is 0 mod 2**32.
    signs = weights.copy()
    signs[[0, 1]] = -signs[[0, 1]]
    reference = _checksum(weights)
    for changed in (ulps, signs):
        assert (_checksum(changed) != reference).all()


def test_device_checksum_sees_swapped_elements_and_halves_of_wide_words():
    value = np.arange(12, dtype=np.float32)
    swapped = value.copy()
    swapped[[2, 9]] = swapped[[9, 2]]
    assert (_checksum(value) != _checksum(swapped)).all()
    # The two 32-bit halves of an 8-byte element hash at distinct positions:
    # swapping them is seen.
    low, high = np.uint64(0x3FF00000), np.uint64(0x12345678)
    wide = np.array([low | (high << np.uint64(32))], np.uint64)
    halves_swapped = np.array([high | (low << np.uint64(32))], np.uint64)
    assert (_checksum(wide) != _checksum(halves_swapped)).all()


def test_device_checksum_of_every_dtype_and_of_nothing():
    values = [
        tf.constant([True, False]),
        tf.constant(np.arange(6, dtype=np.uint8)),
        tf.constant(np.ones(3, np.complex128)),
        tf.Variable(np.zeros((2, 3), np.float32)),
    ]
    sums = _bits.device_checksums(values)
    assert sums.shape == (4, 2) and sums.dtype == np.uint32
    assert _bits.device_checksums([]).shape == (0, 2)
    assert [len(text) for text in _bits.checksum_hex(sums)] == [16] * 4
    assert _bits.checksum_hex(np.array([[1, 0xABCDEF12]], np.uint32)) == [
        "00000001abcdef12"
    ]


def test_device_checksum_is_the_same_with_and_without_xla():
    rng = np.random.default_rng(1)
    values = [
        tf.constant(rng.standard_normal((33, 7)).astype(np.float32)),
        tf.constant(rng.standard_normal(5)),
        tf.constant(rng.integers(0, 9, 4, dtype=np.int8)),
    ]
    np.testing.assert_array_equal(
        _bits.device_checksums(values, xla=True),
        _bits.device_checksums(values, xla=False),
    )


def test_device_checksum_compiles_only_once_the_plain_calls_have_cost_as_much(
    monkeypatch,
):
    compiled_calls = []
    compiled = _bits._compiled_function()

    def counted(values):
        compiled_calls.append(len(values))
        return compiled(values)

    monkeypatch.setattr(_bits, "_compiled_function", lambda: counted)
    monkeypatch.setattr(_bits, "_plain_seconds", 0.0)
    # Whatever the first call takes, on however loaded a machine, is too
    # little to compile one tensor's checksums.
    monkeypatch.setattr(_bits, "XLA_SECONDS_PER_TENSOR", 1e6)
    values = [tf.constant(np.arange(11 * 13, dtype=np.float32).reshape(11, 13))]
    first = _bits.device_checksums(values)
    assert not compiled_calls
    assert _bits._plain_seconds > 0  # Counted: the plain calls add up.
    monkeypatch.setattr(_bits, "_plain_seconds", 1e6)
    np.testing.assert_array_equal(_bits.device_checksums(values), first)
    assert compiled_calls == [1]


def test_the_plain_checksum_is_traced_once_for_every_shape():
    rng = np.random.default_rng(2)
    shapes = [(3,), (4, 5), (2, 3, 4), (7, 1), ()]
    values = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    pair = _bits._pair_function(tf.float32)
    traces = pair.experimental_get_tracing_count()
    plain = _bits.device_checksums(values, xla=False)
    assert pair.experimental_get_tracing_count() <= traces + 1
    np.testing.assert_array_equal(plain, _bits.device_checksums(values, xla=True))


def test_weight_checksums_are_the_device_checksums_when_eager():
    variables = [tf.Variable(np.arange(4, dtype=np.float32)), tf.Variable([1, 2])]
    np.testing.assert_array_equal(
        _bits.weight_checksums(variables), _bits.device_checksums(variables)
    )
    host = _bits.host_checksums([np.arange(4, dtype=np.float32)])
    assert host.shape == (1, 2) and host.dtype == np.uint32


def test_variable_names_are_indexed_and_unique():
    class Named:
        def __init__(self, name, path=None):
            self.name, self.path = name, path

    variables = [Named("kernel", "dense/kernel"), Named("kernel"), Named("kernel")]
    assert _bits.variable_names(variables) == ["0:dense/kernel", "1:kernel", "2:kernel"]


def test_array_digest_depends_on_shape_and_dtype():
    x = np.zeros(4, np.float32)
    assert _bits.array_digest(x) != _bits.array_digest(x.reshape(2, 2))
    assert _bits.array_digest(x) != _bits.array_digest(x.view(np.int32))


def test_logged_arrays_are_recorded_by_digest_not_refused():
    # The worker and the callback share this: a metric logging per-class
    # values must not crash a `tfdet check` run.
    bits = _bits.logged_value_bits(np.array([0.5, 0.25], np.float32))
    assert bits["value"] == "array" and bits["shape"] == [2]
    assert bits["bits"] == _bits.array_digest(np.array([0.5, 0.25], np.float32))
    other = _bits.logged_value_bits(np.array([0.5, 0.5], np.float32))
    assert other["bits"] != bits["bits"]
    assert _bits.ulp_distance(bits, other) is None
    assert _bits.show(bits).startswith("array(2,) [float32 sha256 ")


def test_show_is_value_dtype_and_hex_bits():
    assert _bits.show(_bits.value_bits(np.float32(1))) == "1.0 [float32 0x3f800000]"
    assert _bits.show(None) == "(absent)"


def test_is_finite_names_nan_and_inf_only_for_floats():
    assert _bits.is_finite(_bits.logged_value_bits(float("nan"))) is False
    assert _bits.is_finite(_bits.value_bits(np.float32("-inf"))) is False
    assert _bits.is_finite(_bits.value_bits(np.float64(2.5))) is True
    assert _bits.is_finite(_bits.value_bits(np.int32(3))) is None
    assert _bits.is_finite(_bits.logged_value_bits([1.0, 2.0])) is None
