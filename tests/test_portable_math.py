"""The portable math library and its patches: `portable_math` (Exp, Log,
Log1p, Expm1, Tanh, Sigmoid, Sin, Cos, Pow, Softplus), `portable_log_softmax`
and `fixed_order_sums` (Sum, Mean).

What they promise, each with its control:

- on x86-64 the functions give TensorFlow's own bits wherever TensorFlow's
  kernel takes its packet path (whole packets), and an element's bits do not
  follow its tensor's length (TensorFlow's do: its scalar tail);
- the sums' bits follow neither the pool nor the other rows of the tensor;
- the library's digests here are the record's (`benchmarks/
  portable_math_digests.json`), which the emulated aarch64 part of CI
  compares with its own (tests/test_aarch64.py);
- under `enable()`, `tf.exp`, `tf.reduce_sum`, Keras's losses and layers run
  the library's ops, with TensorFlow's values, shapes, gradients and errors;
  other dtypes keep TensorFlow's ops.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from tests.conftest import REPO, run_json
from tfdet._kernels import library as kernel_library
from tfdet._kernels import portable_math

FUNCTIONS = ("exp", "log", "log1p", "expm1", "tanh", "sigmoid", "sin", "cos")
RAW = {
    "exp": "Exp", "log": "Log", "log1p": "Log1p", "expm1": "Expm1",
    "tanh": "Tanh", "sigmoid": "Sigmoid", "sin": "Sin", "cos": "Cos",
}  # fmt: skip
x86_only = pytest.mark.skipif(
    platform.machine() != "x86_64",
    reason="TensorFlow's x86-64 wheels are the ones built without FMA",
)


@pytest.fixture(scope="module")
def library():
    """The loaded library, built once (conftest's shared kernel cache)."""
    if kernel_library.compiler() is None and portable_math.LIBRARY.shipped() is None:
        pytest.skip("no C++ compiler and no shipped library")
    loaded = portable_math.LIBRARY.load()
    assert loaded is not None
    return loaded


def _bits(tensor) -> np.ndarray:
    return np.asarray(tensor).view(np.uint32)


def _sweep(function: str, length: int = 16 * 4096) -> np.ndarray:
    """Inputs of every kind: normal ones at several scales, random bit
    patterns (subnormals, infinities, NaN among them), the clamps' edges."""
    rng = np.random.default_rng(len(function))
    parts = [rng.standard_normal(length // 4) * s for s in (0.01, 1.0, 9.0, 90.0)]
    bits = rng.integers(0, 2**32, length // 4, dtype=np.uint64).astype(np.uint32)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, -104.0, 16.63, 7.907, 8.02]
    x = np.concatenate([*(p.astype(np.float32) for p in parts), bits.view(np.float32)])
    x = np.concatenate([x, np.float32(edges)])
    return x[: len(x) - len(x) % 16]


@x86_only
@pytest.mark.parametrize("function", FUNCTIONS)
def test_on_x86_the_functions_give_tensorflows_own_bits_on_whole_packets(
    library, function
):
    import tensorflow as tf

    x = tf.constant(_sweep(function))
    found = _bits(library.tfdet_portable_unary(x, function=function))
    own = _bits(getattr(tf.raw_ops, RAW[function])(x=x))
    if function == "log1p":
        # TensorFlow's x86-64 Log1p kernel is not Eigen's generic log1p as its
        # headers compile it (it flushes subnormals, and differs by an ulp on
        # about 0.1% of normal inputs): that one is not TensorFlow's bits.
        assert np.mean(found != own) < 0.005
    else:
        assert np.array_equal(found, own)


@x86_only
@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_on_x86_the_gradients_give_tensorflows_own_bits(library, function):
    import tensorflow as tf

    rng = np.random.default_rng(5)
    y = tf.constant(np.tanh(rng.standard_normal(4096)).astype(np.float32))
    dy = tf.constant(rng.standard_normal(4096).astype(np.float32))
    own = tf.raw_ops.TanhGrad if function == "tanh" else tf.raw_ops.SigmoidGrad
    found = library.tfdet_portable_gradient(y, dy, function=function)
    assert np.array_equal(_bits(found), _bits(own(y=y, dy=dy)))


@pytest.mark.parametrize("function", FUNCTIONS)
def test_an_elements_bits_do_not_follow_its_tensors_length(library, function):
    """The control is the next test: TensorFlow's own op gives its last
    `length % packet` elements the scalar function's other bits."""
    x = _sweep(function, 4096)
    whole = _bits(library.tfdet_portable_unary(x, function=function))
    for length in (1, 7, 17, 4095):
        part = _bits(library.tfdet_portable_unary(x[:length], function=function))
        assert np.array_equal(part, whole[:length]), length
    assert library.tfdet_portable_unary(x[:0], function=function).shape == (0,)


def test_tensorflows_own_sigmoid_follows_the_tensors_length():
    """The control of the test above: the scalar tail's other bits."""
    import tensorflow as tf

    x = np.float32(np.linspace(-6, 6, 4096))
    whole = _bits(tf.raw_ops.Sigmoid(x=x))
    assert any(
        not np.array_equal(_bits(tf.raw_ops.Sigmoid(x=x[:n])), whole[:n])
        for n in range(1, 16)
    )


def test_pow_takes_a_number_or_a_tensor_of_the_bases_shape(library):
    import tensorflow as tf

    base = np.float32(np.linspace(0.01, 5, 1001))
    cube = library.tfdet_portable_pow(base, np.float32(3.0))
    np.testing.assert_allclose(cube, base.astype(np.float64) ** 3, rtol=1e-6)
    exponent = np.float32(np.linspace(-2, 2, 1001))
    np.testing.assert_allclose(
        library.tfdet_portable_pow(base, exponent), base**exponent, rtol=1e-5
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="exponent of rank 0"):
        library.tfdet_portable_pow(base, exponent[:3])


@pytest.mark.parametrize(
    ("shape", "mean"),
    [((32, 64, 1), False), ((1, 3000, 48), False), ((2, 70000, 3), True),
     ((5, 1, 7), False), ((0, 4, 2), False), ((3, 0, 2), False), ((3, 0, 2), True)],
)  # fmt: skip
def test_the_sum_is_tensorflows_sum_to_its_rounding(library, shape, mean):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    found = np.asarray(library.tfdet_fixed_order_sum(x, 1, mean=mean))
    assert found.shape == (shape[0], shape[2])
    with np.errstate(invalid="ignore", divide="ignore"):
        reference = x.astype(np.float64).sum(1) / (shape[1] if mean else 1)
    np.testing.assert_allclose(found, reference, rtol=1e-5, atol=1e-4)


def test_a_rows_sum_does_not_follow_the_other_rows(library):
    x = np.random.default_rng(1).standard_normal((64, 5000, 1)).astype(np.float32)
    whole = _bits(library.tfdet_fixed_order_sum(x, [1, 2]))
    for rows in (1, 5, 33):
        assert np.array_equal(
            _bits(library.tfdet_fixed_order_sum(x[:rows], [1, 2])), whole[:rows]
        )


# One process's digests of the library's ops (and, the control, of
# TensorFlow's own), by `benchmarks/portable_math_digests.py`, at the pool
# size the environment sets.
DIGESTS = f"""
import json, sys
sys.path.insert(0, {str(REPO / "benchmarks")!r})
import portable_math_digests
print(json.dumps(portable_math_digests.digests()))
"""


def test_the_digests_are_the_records_at_any_pool():
    benchmark = _benchmark()
    found = {
        threads: run_json(DIGESTS, TF_NUM_INTRAOP_THREADS=str(threads))
        for threads in (1, 2)
    }
    assert found[1]["kernel"] == found[2]["kernel"]
    record = benchmark.recorded()
    if platform.machine() in record:
        assert found[1]["kernel"] == record[platform.machine()]["digests"]["kernel"]
    # The control: TensorFlow's own ops give other bits on the same inputs
    # (their scalar tails, their sums' order), so the digests tell the two
    # apart.
    assert found[1]["tensorflow"] != found[1]["kernel"]


def _benchmark():
    """`benchmarks/portable_math_digests.py`, loaded by path."""
    import importlib.util

    path = REPO / "benchmarks" / "portable_math_digests.py"
    spec = importlib.util.spec_from_file_location("portable_math_digests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Under enable(): which op each call ran, its values against TensorFlow's
# (plain, in the same process: the patches undone), shapes and gradients.
UNDER_ENABLE = """
import json
import numpy as np
import tfdet
from tfdet._patching import _registry
tfdet.enable(seed=0)
import tensorflow as tf
import keras

rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((6, 5, 4)).astype(np.float32))
norm = keras.layers.LayerNormalization()
norm.build((None, 5, 4))
cases = {
    "sum_all": lambda v: tf.reduce_sum(v),
    "sum_last": lambda v: tf.reduce_sum(v, -1),
    "sum_keep": lambda v: tf.reduce_sum(v, [0, 1], keepdims=True),
    "sum_apart": lambda v: tf.reduce_sum(v, [0, 2]),
    "mean_first": lambda v: tf.reduce_mean(v, 0),
    "mean_apart_keep": lambda v: tf.reduce_mean(v, [2, 0], keepdims=True),
    "exp": tf.exp, "log1p": lambda v: tf.math.log1p(tf.abs(v)),
    "tanh": tf.tanh, "sigmoid": tf.sigmoid, "softplus": tf.nn.softplus,
    "cube": lambda v: tf.pow(v, 3.0), "sin": tf.sin,
    "log_softmax": tf.nn.log_softmax, "softmax": tf.nn.softmax,
    "gelu_tanh": lambda v: keras.activations.gelu(v, approximate=True),
    "layer_norm": lambda v: norm(v),
    "crossentropy": lambda v: keras.losses.categorical_crossentropy(
        tf.nn.softmax(v * 0.5), tf.nn.softmax(v)),
}

def run(function):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
    return y, tape.gradient(y, x)

def ops(function):
    graph = tf.function(function).get_concrete_function(
        tf.TensorSpec([None, 5, 4], tf.float32)).graph
    return sorted({op.type for op in graph.get_operations() if op.type.startswith("Tfdet")})

found = {}
for name, function in cases.items():
    y, g = run(function)
    found[name] = {"ops": ops(function), "shape": y.shape.as_list(),
                   "value": np.asarray(y, np.float64).tolist(),
                   "gradient": np.asarray(g, np.float64).tolist()}
found["float64_ops"] = ops(lambda v: tf.reduce_sum(tf.exp(tf.cast(v, tf.float64))))
# A bias's gradient through a broadcast addition: its axes are known only
# when it runs (BroadcastGradientArgs of a batch of unknown size).
bias = tf.Variable(tf.zeros([4]))

def bias_gradient(v):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(v + bias))
    return tape.gradient(loss, bias)

graph = tf.function(bias_gradient).get_concrete_function(
    tf.TensorSpec([None, 5, 4], tf.float32)).graph
found["bias_gradient_ops"] = sorted({op.type for op in graph.get_operations()
                                     if op.type in ("Sum", "TfdetFixedOrderSum")})
found["bias_gradient"] = np.asarray(bias_gradient(x), np.float64).tolist()
found["bias_gradient_expected"] = (2 * np.asarray(x, np.float64).sum((0, 1))).tolist()
found["int_sum"] = int(tf.reduce_sum(tf.constant([1, 2, 3])))
try:
    tf.reduce_sum(x, 3)
    found["bad_axis"] = None
except tf.errors.InvalidArgumentError as error:
    found["bad_axis"] = type(error).__name__
found["empty_mean"] = float(tf.reduce_mean(tf.zeros([0], tf.float32)))

# TensorFlow's own op test's case: an axis named twice, its error's text.
def repeated_axes():
    try:
        tf.reduce_sum(tf.constant([1.0, 2.0]), tf.constant([0, 0]))
    except tf.errors.InvalidArgumentError as error:
        return error.message
    return None

found["repeated_axes"] = repeated_axes()
_registry.restore()
found["repeated_axes_plain"] = repeated_axes()
found["restored_ops"] = ops(lambda v: tf.reduce_sum(tf.exp(v)))
for name, function in cases.items():
    y, g = run(function)
    found[name]["plain"] = [np.asarray(y, np.float64).tolist(),
                            np.asarray(g, np.float64).tolist()]
print(json.dumps(found))
"""


def test_under_enable_the_calls_run_the_library_with_tensorflows_values():
    found = run_json(UNDER_ENABLE)
    for name, case in found.items():
        if not isinstance(case, dict):
            continue
        assert case["ops"], (name, "ran no op of the library")
        value, gradient = case["plain"]
        assert case["shape"] == list(np.shape(value)), name
        np.testing.assert_allclose(case["value"], value, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(case["gradient"], gradient, rtol=2e-4, atol=2e-5)
    assert found["sum_keep"]["shape"] == [1, 1, 4]
    assert found["mean_apart_keep"]["shape"] == [1, 5, 1]
    assert "TfdetFixedOrderSum" in found["crossentropy"]["ops"]
    assert found["float64_ops"] == []
    assert found["bias_gradient_ops"] == ["TfdetFixedOrderSum"]
    np.testing.assert_allclose(
        found["bias_gradient"], found["bias_gradient_expected"], rtol=1e-5
    )
    assert found["restored_ops"] == []  # "plain" was TensorFlow's own ops.
    assert found["int_sum"] == 6
    assert found["bad_axis"] == "InvalidArgumentError"
    assert np.isnan(found["empty_mean"])
    duplicate = "Axes contains duplicate dimension: 0"
    assert duplicate in found["repeated_axes_plain"]  # TensorFlow's own op.
    assert duplicate in found["repeated_axes"]


ORTHOGONAL = """
import json
import numpy as np
import tfdet
from tfdet._patching import _registry
tfdet.enable(seed=0)
import keras
import tensorflow as tf

found = {"installed": "portable_orthogonal" in _registry.installed()}
for shape in [(8, 32), (32, 8), (3, 3, 4, 6)]:
    ours = np.asarray(keras.initializers.Orthogonal(gain=2.0, seed=5)(shape))
    found[str(shape)] = ours.tolist()
_registry.restore()
for shape in [(8, 32), (32, 8), (3, 3, 4, 6)]:
    keras_own = np.asarray(keras.initializers.Orthogonal(gain=2.0, seed=5)(shape))
    found[str(shape) + " keras"] = keras_own.tolist()
print(json.dumps(found))
"""


def test_the_orthogonal_initializer_gives_keras_values_to_rounding():
    """Gram-Schmidt's Q is Keras's (Householder's, sign-fixed) to float32
    rounding, orthonormal (times the gain), in every shape Keras takes."""
    found = run_json(ORTHOGONAL)
    assert found["installed"]
    for shape in ("(8, 32)", "(32, 8)", "(3, 3, 4, 6)"):
        ours, keras_own = np.array(found[shape]), np.array(found[shape + " keras"])
        np.testing.assert_allclose(ours, keras_own, atol=2e-6)
        flat = ours.reshape(-1, ours.shape[-1]) / 2.0
        gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
        np.testing.assert_allclose(gram, np.eye(len(gram)), atol=1e-6)


# A plain sum's gradient is a constant of ones that Grappler folds; a
# gradient formula's `ones / x` then becomes TensorFlow's `Reciprocal`, an
# approximate instruction plus a Newton step with other bits on x86-64 and
# aarch64 (it parted the cross-entropy models' gradients). Under enable()
# the gradients divide once, correctly rounded, however Grappler folds.
SUM_GRADIENTS = """
import json
import numpy as np
import tfdet
from tfdet._patching import _registry
tfdet.enable(seed=0)
import tensorflow as tf

x = np.random.default_rng(0).uniform(0.01, 30.0, (64, 37)).astype(np.float32)
exact = {"log": np.float32(1) / x, "log1p": np.float32(1) / (np.float32(1) + x)}

def differing():
    found = {}
    for name, function in (("log", tf.math.log), ("log1p", tf.math.log1p)):
        @tf.function
        def sum_gradient(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                total = tf.reduce_sum(function(v))
            return tape.gradient(total, v)
        found[name] = int(np.sum(sum_gradient(tf.constant(x)).numpy() != exact[name]))
    return found

found = {"tfdet": differing()}
_registry.restore()
found["tensorflow"] = differing()
print(json.dumps(found))
"""


def test_a_sums_gradient_divides_once_however_grappler_folds_it():
    found = run_json(SUM_GRADIENTS)
    assert found["tfdet"] == {"log": 0, "log1p": 0}
    # The control: TensorFlow's own gradients, folded, take the approximate
    # reciprocal on this CPU.
    assert found["tensorflow"]["log"] > 0, found
    assert found["tensorflow"]["log1p"] > 0, found
