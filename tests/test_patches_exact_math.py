"""The portable_* patches: the ops whose CPU bits depend on the CPU model.

Eigen computes float32 `Rsqrt`, `Reciprocal`/`Inv`, Softmax's normalisation
and `Erfc`'s `1/x^2` with the approximate x86 instructions RSQRTPS / RCPPS,
whose bits differ between Intel, AMD and QEMU. The patches compute them
with correctly rounded IEEE operations instead. A correctly rounded result is
the same on every IEEE-754 CPU, so the proof needs no second machine: the
patched ops' bits must equal a NumPy reference built from correctly rounded
operations (NumPy's float32 sqrt and division are; its exp is not, so TF's
`Exp`, measured equal across CPU models, supplies exponentials), in eager and
inside a `tf.function` (Grappler on: it rewrites `1/sqrt(y)` into `Rsqrt` and
`1/y` into `Reciprocal` when it can); and the unpatched op must differ from
that reference on this CPU, so the test can fail. Forward values stay within
a few ulps of the original op; gradients use the original's formula.

TensorFlow's `Erfc` kernel takes the approximate reciprocal from 2.20 only
(Eigen's `generic_fast_erfc<float>`): up to 2.19 its bits, and the exact
GELU's, were measured the same natively and on an emulated CPU, so
`enable()` leaves it there, and the tests of the erfc patch compare it with
the kernel only where the kernel is that algorithm.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.conftest import (  # noqa: E402
    ERFC_FOLLOWS_THE_CPU,
    REPO,
    TENSORFLOW_RELEASE,
    clean_env,
    last_json_line,
    run_python,
    run_tfdet,
)
from tfdet._graph import _scan  # noqa: E402
from tfdet._patching import _registry  # noqa: E402
from tfdet._pin import _isa  # noqa: E402
from tfdet.patches import portable_erfc  # noqa: E402

NAMES = ("portable_erfc", "portable_reciprocal", "portable_rsqrt", "portable_softmax")
APPROXIMATE = {"Rsqrt", "Reciprocal", "Inv", "Softmax", "Erfc"}
EPS32 = float(np.finfo(np.float32).eps)
MODELS = str(REPO / "tests" / "targets" / "cpu_model_models.py")
# The exact GELU reaches Erfc from 2.19 (Erf before); Erfc takes RCPPS from
# 2.20 (conftest's ERFC_FOLLOWS_THE_CPU).
GELU_TAKES_ERFC = TENSORFLOW_RELEASE >= (2, 19)
# The patches `enable()` installs on this TensorFlow.
NEEDED = NAMES if ERFC_FOLLOWS_THE_CPU else tuple(set(NAMES) - {"portable_erfc"})


@contextlib.contextmanager
def patched() -> Iterator[None]:
    patches = [_registry.available()[name] for name in NAMES]
    for patch in patches:
        patch.install()
    try:
        yield
    finally:
        for patch in patches:
            patch.restore()


def sweep() -> np.ndarray:
    """Float32 values: a dense stride over every bit pattern, plus edge cases."""
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5],
        dtype=np.float32,
    )
    tiny = np.array(
        [1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x80000001], dtype=np.uint32
    ).view(np.float32)
    return np.concatenate([bits.view(np.float32), edges, tiny])


def flush(values: np.ndarray) -> np.ndarray:
    """Subnormals to signed zero: TensorFlow's CPU kernels run with FTZ/DAZ."""
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(values) < tiny, np.copysign(np.float32(0), values), values)


def same_bits(actual: np.ndarray, expected: np.ndarray) -> int:
    """How many elements differ (nan equals nan, whatever its payload)."""
    both_nan = np.isnan(actual) & np.isnan(expected)
    return int(np.sum((actual.view(np.uint32) != expected.view(np.uint32)) & ~both_nan))


def both_ways(function, *args) -> tuple[np.ndarray, np.ndarray]:
    """`function(*args)` eager and inside a fresh `tf.function` (Grappler on)."""
    eager = function(*args).numpy()
    graph = tf.function(function)(*args).numpy()
    return eager, graph


def graph_ops(function, *args) -> set[str]:
    """Op types of `function` and of its gradient, traced on `args`."""

    def with_gradient(*values):
        with tf.GradientTape() as tape:
            for value in values:
                tape.watch(value)
            result = function(*values)
        return result, tape.gradient(result, values)

    concrete = tf.function(with_gradient).get_concrete_function(*args)
    return {node.op_type for node in _scan.walk(concrete.graph.as_graph_def())}


def test_patches_are_installed_by_default_on_this_tensorflow() -> None:
    # Portability is the product's promise: `enable()` installs them, and
    # not the erfc patch where TensorFlow's own Erfc is already portable.
    auto = set(_registry.resolve("auto"))
    assert set(NEEDED) <= auto
    assert ("portable_erfc" in auto) == ERFC_FOLLOWS_THE_CPU


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("rsqrt", lambda x: np.float32(1) / np.sqrt(x)),
        ("reciprocal", lambda x: np.float32(1) / x),
    ],
)
def test_rsqrt_and_reciprocal_are_correctly_rounded(name, reference) -> None:
    x = sweep()
    with np.errstate(all="ignore"):
        expected = flush(reference(flush(x)))
    function = getattr(tf.math, name)
    original = function(x).numpy()
    # The kernel is not correctly rounded here: the comparison can fail.
    assert same_bits(original, expected) > 1000
    with patched():
        eager, graph = both_ways(getattr(tf.math, name), tf.constant(x))
    assert same_bits(eager, expected) == 0
    assert same_bits(graph, expected) == 0
    # The kernel is within ~2 ulps of the patch's correctly rounded result
    # (away from the range's ends, where the kernel's reciprocal loses more).
    middle = (np.abs(x) > 2.0**-60) & (np.abs(x) < 2.0**60)
    np.testing.assert_allclose(eager[middle], original[middle], rtol=4 * EPS32)


def test_inv_and_other_dtypes() -> None:
    from tensorflow.python.ops import gen_math_ops

    x = np.array([3.0, 7.0, -0.1, 0.0], np.float32)
    with np.errstate(divide="ignore"):  # 1 / 0 = inf is part of the reference.
        reference = np.float32(1) / x
    with patched():
        assert same_bits(gen_math_ops.inv(x).numpy(), reference) == 0
        # float64 keeps correctly rounded (rsqrt) or its kernel's results.
        wide = np.array([3.0, 0.7], np.float64)
        assert tf.math.rsqrt(wide).numpy().tolist() == (1 / np.sqrt(wide)).tolist()
        assert tf.math.erfc(wide).numpy().tolist() == [
            math.erfc(3.0),
            math.erfc(0.7),
        ] or (np.allclose(tf.math.erfc(wide).numpy(), [math.erfc(3.0), math.erfc(0.7)]))
        half = tf.math.rsqrt(tf.constant([4.0], tf.float16))
        assert half.dtype == tf.float16 and half.numpy().tolist() == [0.5]


def softmax_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    special = np.array(
        [[0.0, -np.inf, 1.0, 2.0], [80.0, 88.0, -100.0, 3.0], [1e-30, 0.0, 0.0, 0.0]],
        np.float32,
    )
    return [
        (rng.standard_normal((256, 37)) * scale).astype(np.float32)
        for scale in (0.1, 1.0, 30.0)
    ] + [special]


@pytest.mark.parametrize("index", range(4))
def test_softmax_divides_by_the_sum(index: int) -> None:
    logits = softmax_inputs()[index]
    exps = tf.exp(logits - np.max(logits, axis=-1, keepdims=True)).numpy()
    sums = tf.reduce_sum(exps, axis=-1, keepdims=True).numpy()
    expected = flush(exps / sums)  # One correctly rounded division each.
    original = tf.nn.softmax(logits).numpy()
    with patched():
        eager, graph = both_ways(tf.nn.softmax, tf.constant(logits))
    assert same_bits(eager, expected) == 0
    assert same_bits(graph, expected) == 0
    # The sum runs in Sum's order, not the kernel's: a few ulps.
    np.testing.assert_allclose(eager, original, rtol=8 * EPS32, atol=1e-37)


def test_the_softmax_kernel_is_not_a_true_division_here() -> None:
    misses = 0
    for logits in softmax_inputs()[:3]:
        exps = tf.exp(logits - np.max(logits, axis=-1, keepdims=True)).numpy()
        sums = tf.reduce_sum(exps, axis=-1, keepdims=True).numpy()
        misses += same_bits(tf.nn.softmax(logits).numpy(), flush(exps / sums))
    assert misses > 0


def erfc_reference(x: np.ndarray) -> np.ndarray:
    """Eigen's float32 erfc algorithm in NumPy float32 (exp from TF's `Exp`),
    every intermediate flushed as TensorFlow's kernels flush them."""
    f = np.float32
    x = np.clip(flush(x), f(-11), f(11))

    def horner(v, coefficients):
        result = np.full_like(v, f(coefficients[0]))
        for coefficient in coefficients[1:]:
            result = flush(flush(result * v) + f(coefficient))
        return result

    with np.errstate(all="ignore"):
        x2 = flush(x * x)
        small = flush(flush(x * horner(x2, portable_erfc._ALPHA)) + f(1))
        x2_lo = flush((x.astype(np.float64) ** 2 - x2.astype(np.float64)).astype(f))
        exp2_hi = tf.exp(-x2).numpy()
        z = flush(exp2_hi - flush(exp2_hi * x2_lo))
        q2 = flush(f(1) / x2)
        numerator = horner(q2, portable_erfc._GAMMA)
        ratio = flush(numerator / flush(x * horner(q2, portable_erfc._DELTA)))
        large = flush(flush(z * ratio) + np.where(x < 0, f(2), f(0)))
    return np.where(x2 > 1, large, small).astype(f)


def test_erfc_is_the_same_algorithm_with_true_divisions_and_stays_accurate() -> None:
    x = np.concatenate(
        [
            np.linspace(-12, 12, 200_001, dtype=np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40], np.float32),
        ]
    )
    expected = erfc_reference(x)
    original = tf.math.erfc(x).numpy()
    with patched():
        eager, graph = both_ways(tf.math.erfc, tf.constant(x))
    assert same_bits(eager, expected) == 0
    assert same_bits(graph, expected) == 0
    exact = np.array(
        [math.erfc(v) if np.isfinite(v) else np.nan for v in x.astype(float)]
    )

    def ulps(values: np.ndarray, where: np.ndarray) -> float:
        error = np.abs(values[where] - exact[where])
        return float(np.max(error / np.spacing(exact[where].astype(np.float32))))

    # Below 8 ulps where the result is above 1e-30; near float32's underflow,
    # where exp(-x^2) is flushed, the algorithm's own error (65 ulps).
    normal = np.isfinite(x) & (exact > np.finfo(np.float32).tiny)
    assert ulps(eager, np.isfinite(x) & (exact > 1e-30)) < 8
    assert ulps(eager, normal) < 66
    assert np.isnan(eager[np.isnan(x)]).all()
    if ERFC_FOLLOWS_THE_CPU:
        # The kernel is the same algorithm with RCPPS: the comparison can
        # fail, and the patch is as accurate as the kernel.
        assert same_bits(original, expected) > 0
        assert ulps(eager, normal) <= ulps(original, normal) + 1
        np.testing.assert_allclose(eager, original, rtol=8 * EPS32, atol=1e-37)


@pytest.mark.skipif(
    not GELU_TAKES_ERFC,
    reason=f"TensorFlow {tf.__version__}'s exact GELU takes Erf, which no patch changes",
)
def test_exact_gelu_stays_within_a_few_ulps() -> None:
    x = np.linspace(-10, 10, 100_001, dtype=np.float32)
    original = tf.nn.gelu(x, approximate=False).numpy()
    with patched():
        eager, graph = both_ways(lambda t: tf.nn.gelu(t, approximate=False), x)
    assert same_bits(eager, graph) == 0
    np.testing.assert_allclose(eager, original, rtol=8 * EPS32, atol=1e-37)


CASES = {
    "rsqrt": (
        lambda t: tf.math.rsqrt(t),
        lambda: np.linspace(0.1, 5, 64, dtype=np.float32),
    ),
    "reciprocal": (
        lambda t: tf.math.reciprocal(t),
        lambda: np.linspace(0.1, 5, 64, dtype=np.float32),
    ),
    "softmax": (
        lambda t: tf.nn.softmax(t) * tf.range(1.0, 9.0),
        lambda: np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32),
    ),
    "erfc": (
        lambda t: tf.math.erfc(t),
        lambda: np.linspace(-4, 4, 64, dtype=np.float32),
    ),
    "gelu": (
        lambda t: tf.nn.gelu(t, approximate=False),
        lambda: np.linspace(-4, 4, 64, dtype=np.float32),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_equal_the_original_and_no_approximate_op_remains(case: str) -> None:
    function, make = CASES[case]
    x = tf.constant(make())

    def gradient(value):
        with tf.GradientTape() as tape:
            tape.watch(value)
            result = function(value)
        return tape.gradient(result, value)

    original = gradient(x).numpy()
    if case == "gelu" and not GELU_TAKES_ERFC:
        # Erf's arithmetic: nothing approximate to replace on this TensorFlow.
        assert not graph_ops(function, x) & APPROXIMATE
    else:
        assert graph_ops(function, x) & APPROXIMATE  # The test can fail.
    with patched():
        eager, graph = both_ways(gradient, x)
        assert not graph_ops(function, x) & APPROXIMATE
    # Same formula as the original gradient, on outputs a few ulps apart
    # (Grappler may reorder the rest of the graph's arithmetic).
    for result in (eager, graph):
        np.testing.assert_allclose(result, original, rtol=16 * EPS32, atol=1e-6)


def test_keras_crossentropy_still_takes_the_softmax_logits() -> None:
    # Keras finds the logits of a softmax output by `_keras_logits` (set by
    # its softmax) rather than by the op type, which the patch changes.
    import keras

    logits = tf.constant([[1.0, 2.0, 30.0]])
    with patched():
        probabilities = keras.activations.softmax(logits)
        loss = keras.losses.sparse_categorical_crossentropy(
            np.array([0]), probabilities
        )
    assert np.isclose(loss.numpy()[0], 29.0, rtol=1e-5)


def scan(tmp_path: Path, *flags: str) -> tuple[int, dict]:
    report = tmp_path / "scan.json"
    result = run_tfdet("scan", f"{MODELS}:keras3", *flags, "--json", str(report))
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result.returncode, json.loads(report.read_text())


def test_scan_lists_the_cpu_model_dependent_ops_and_enable_removes_them(
    tmp_path: Path,
) -> None:
    code, report = scan(tmp_path, "--no-enable")
    assert code == 1
    found = {(f["op_type"], f["source"]) for f in report["findings"]}
    assert {("Rsqrt", "bn"), ("Reciprocal", "inverse"), ("Softmax", "head")} <= found
    # TensorFlow's own Erfc is portable before 2.20: no finding there.
    assert (("Erfc", "gelu") in found) == ERFC_FOLLOWS_THE_CPU
    assert {f["behaviour"] for f in report["findings"]} == {"machine_dependent"}
    assert {f["device"] for f in report["findings"]} == {"CPU"}
    code, report = scan(tmp_path)
    assert code == 0 and report["findings"] == []
    assert set(NEEDED) <= set(report["patches"])


# FusedBatchNormV3 (tf_keras's BatchNormalization) in inference mode with
# x = 1, mean = 0, scale = 1, offset = 0 returns its normalizing factor
# 1/sqrt(variance + epsilon) per channel. Prints how many of 100,000 channels
# differ from float32 sqrt followed by float32 division (correctly rounded
# IEEE operations, so the same on every CPU).
_FUSED_BATCH_NORM = """
import json
import numpy as np
import tensorflow as tf
channels = 100_000
variance = np.random.default_rng(0).uniform(0.01, 100.0, channels).astype(np.float32)
epsilon = np.float32(0.001)
zeros, ones = np.zeros(channels, np.float32), np.ones(channels, np.float32)
factor, *_ = tf.compat.v1.nn.fused_batch_norm(
    np.ones((1, 1, 1, channels), np.float32), ones, zeros, mean=zeros,
    variance=variance, epsilon=float(epsilon), is_training=False,
)
ieee = np.float32(1) / np.sqrt(variance + epsilon)
differ = factor.numpy().ravel().view(np.uint32) != ieee.view(np.uint32)
print(json.dumps({"differ": int(differ.sum())}))
"""


def _fused_batch_norm_differences(onednn: str) -> int:
    result = run_python(
        _FUSED_BATCH_NORM,
        env=clean_env(TF_ENABLE_ONEDNN_OPTS=onednn, ONEDNN_MAX_CPU_ISA="AVX2"),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)["differ"]


@pytest.mark.skipif(
    not _isa.applies() or not _isa.supports("AVX2"),
    reason="needs an x86-64 CPU with AVX2",
)
def test_fused_batch_norm_is_exact_with_onednn_and_approximate_without() -> None:
    # With oneDNN's custom ops on (enable()'s default), tf_keras's fused
    # BatchNormalization takes its normalizing factor from IEEE sqrt and
    # division, which no CPU model changes. With them off (onednn=False)
    # Eigen's kernel takes the approximate rsqrt: its bits follow the CPU.
    assert _fused_batch_norm_differences("1") == 0
    assert _fused_batch_norm_differences("0") > 1000
