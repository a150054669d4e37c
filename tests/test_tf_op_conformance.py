"""tfdet's patches behave as TensorFlow's own ops on TensorFlow's own op tests.

`ci/tf_op_tests.py` runs TensorFlow's op tests (`kernel_tests/`) in a
process without tfdet and in one under `tfdet.enable()`; here a small part
of them: the bases TensorFlow's wheel ships (BiasAdd and its gradient;
the softmax cross-entropy, whose known difference is the run's positive
control), and, where TensorFlow's test files are there
(`$TFDET_TF_OP_TESTS`, see the harness), the tests that failed under
tfdet before the fixes. No test that passes without tfdet may fail with it
unless `KNOWN_DIFFERENCES` names it with the reason, and the tfdet run must
have had the kernels.

Then each difference those tests found, fixed in the patches, on its own:
a fresh process under `enable()` computes it by the patched wrapper and by
TensorFlow's own (`GeneratedOp.tensorflows`), and says which ops the
patched one traced to.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, ci_module, clean_env, last_json_line, run_python

HARNESS = ci_module("tf_op_tests")

# Each module the harness runs here, and its part: the wheel's always; the
# others where TensorFlow's files are (they failed under tfdet before the
# fixes: Einsum's broadcast, MatMul's errors, Conv2DBackpropInput's 2 sizes
# and empty output gradient, the Erfc probe under a TF1 graph, Sum's
# repeated axes).
WHEEL_MODULES = {
    "bias_add": "testGradientTensor2D or testEmptyGradient",
    # tfdet's op determinism changes its gradient: a known difference, the
    # control that the tfdet run is tfdet's and that differences are seen.
    "xent": "testSingleClass",
}
FILE_MODULES = {
    "einsum": "EinsumOpTest and testBroadcasting",
    "matmul": "MatMulInfixOperatorTest",
    "conv": "SpatialDimensions or Degenerate or InvalidOutBackprop",
    "unary": "testFloatEmpty",
    # An axis named twice: TensorFlow's error, not a sum.
    "reduction": "testInvalidRepeatedReductionIndices",
}


def _present(name: str) -> bool:
    tests_dir = HARNESS._parse([]).tests_dir
    return HARNESS._module_text(HARNESS.MODULES[name], tests_dir) is not None


def test_no_tensorflow_op_test_fails_only_under_tfdet() -> None:
    modules = dict(WHEEL_MODULES)
    modules.update({name: k for name, k in FILE_MODULES.items() if _present(name)})
    arguments = [f"--module={name}={keyword}" for name, keyword in modules.items()]
    done = subprocess.run(
        [sys.executable, str(REPO / "ci" / "tf_op_tests.py"), "--one-process",
         "--timeout", "500", *arguments],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    report = last_json_line(done.stdout)
    assert not report["incomplete"], output[-5000:]
    assert report["broken_by_tfdet"] == [], output[-5000:]
    assert done.returncode == 0, output[-5000:]
    for name in modules:
        result = report["modules"][name]
        # The tfdet run had the kernels (not the compositions' fallback) ...
        assert set(HARNESS.EXPECTED_KERNELS) <= set(result["kernels"]), name
        # ... and both runs ran the tests (none deselected by a typo).
        assert result["without_tfdet"]["passed"] > 0, name
        assert result["with_tfdet"]["passed"] + result["with_tfdet"]["failed"] > 0
    # The control: under tfdet, TensorFlow's deterministic cross-entropy.
    assert set(report["known_differences"]) == {"xent::XentOpTest::testSingleClass"}


def test_a_test_broken_by_tfdet_fails_the_harness() -> None:
    """The comparison itself: a test passing only without tfdet is listed."""
    plain = {"complete": True, "outcomes": {"m": {"A::t": "passed", "A::u": "passed"}}}
    patched = {
        "complete": True,
        "outcomes": {"m": {"A::t": "failed", "A::u": "passed"}},
        "profile": {"kernels": list(HARNESS.EXPECTED_KERNELS)},
    }
    result = HARNESS.compare("m", plain, patched)
    assert result["broken_by_tfdet"] == ["m::A::t"]
    assert result["with_tfdet"] == {"passed": 1, "failed": 1, "skipped": 0}


# One fresh process under enable() computes every case below; each test
# reads its part. "tensorflow" is TensorFlow's own wrapper's result.
CASES = r"""
import json
import math
import numpy as np
import tfdet
tfdet.enable()
import tensorflow as tf
from tensorflow.python.ops import gen_linalg_ops, gen_math_ops, gen_nn_ops, math_ops
from tensorflow.python.ops import gradient_checker_v2
from tfdet.patches import fixed_order_convolutions, fixed_order_products

out = {"kernels": list(tfdet.profile().kernels)}

def ops_of(function, *args):
    graph = tf.function(function).get_concrete_function(*args).graph
    return sorted({op.type for op in graph.get_operations()})

def error(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        text = getattr(e, "message", str(e))
        if text.startswith("{{function_node"):  # The kernel's name, then the text.
            text = text.split("}} ", 1)[1]
        # Eager: "... [Op:MatMul] name: "; traced: "... for '{{node matmul}} = ...".
        return [type(e).__name__, text.split(" [Op:")[0].split(" for '{{node")[0]]
    return None

# Erfc first, under a TF1 graph: the portable kernel's probe runs then.
with tf.Graph().as_default():
    y = math_ops.erfc(tf.constant([0.5, 1.0, -2.0]))
    with tf.compat.v1.Session() as session:
        found = session.run(y)
out["erfc_tf1"] = {"found": found.tolist(),
                   "expected": [math.erfc(v) for v in (0.5, 1.0, -2.0)]}

# Einsum: ellipsis dimensions of 1 against larger ones.
rng = np.random.default_rng(0)
einsum_tf = fixed_order_products._EINSUM.tensorflows
out["einsum"] = {}
for equation, a, b in [
    ("...ij,...jk->...ik", (3, 1, 2, 3), (1, 1, 7, 3, 5)),
    ("i...j,j...k->...ik", (2, 1, 3, 1, 3), (3, 1, 7, 5)),
    ("...abc,...abcd->...d", (1, 1, 2, 3, 4), (5, 2, 3, 4, 6)),
    ("i...j,j...k->i...k", (3, 1, 2, 2), (2, 2, 3, 1, 4)),
]:
    x = tf.constant(rng.normal(size=a), tf.float32)
    z = tf.constant(rng.normal(size=b), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, z])
        found = gen_linalg_ops.einsum([x, z], equation)
        expected = einsum_tf([x, z], equation)
    out["einsum"][equation] = {
        "error": float(np.abs(found - expected).max()),
        "scale": float(np.abs(expected).max()),
        "shapes": [found.shape.as_list(), expected.shape.as_list()],
        "gradient_error": max(
            float(np.abs(g - h).max())
            for g, h in zip(tape.gradient(found, [x, z]),
                            tape.gradient(expected, [x, z]))),
        "ops": ops_of(lambda x, z: gen_linalg_ops.einsum([x, z], equation), x, z),
    }
# "...->..." checked as EinsumGradTest checks it, in graph mode too (where
# its numerical gradient came out 0 when the einsum returned its input).
import io, unittest
from absl import flags
from tensorflow.python.framework import test_util
from tensorflow.python.platform import test
flags.FLAGS.mark_as_parsed()
out["einsum_identity_gradient"] = {}

class Identity(test.TestCase):
    @test_util.run_in_graph_and_eager_modes
    def testGradient(self):
        with self.cached_session():
            x = tf.constant(np.float32(0.3), shape=())
            theoretical, numerical = gradient_checker_v2.compute_gradient(
                lambda *xs: gen_linalg_ops.einsum(xs, "...->..."), [x])
        mode = "eager" if tf.executing_eagerly() else "graph"
        out["einsum_identity_gradient"][mode] = [
            np.asarray(theoretical).tolist(), np.asarray(numerical).tolist()]

unittest.TextTestRunner(stream=io.StringIO()).run(
    unittest.defaultTestLoader.loadTestsFromTestCase(Identity))

# Conv2DBackpropInput given [height, width]: TensorFlow's own given all 4.
conv = fixed_order_convolutions._CONVOLUTIONS
kernel = tf.constant(np.arange(1, 9, dtype=np.float32).reshape(2, 2, 1, 2))
upstream = tf.constant(np.arange(1, 3, dtype=np.float32).reshape(1, 1, 1, 2))
attributes = dict(strides=[1, 1, 1, 1], padding="VALID")
found = gen_nn_ops.conv2d_backprop_input([2, 2], kernel, upstream, **attributes)
expected = conv["conv2d_backprop_input"].tensorflows(
    [1, 2, 2, 1], kernel, upstream, **attributes)
out["two_sizes"] = {
    "found": found.numpy().tolist(), "expected": expected.numpy().tolist(),
    "ops": ops_of(lambda s: gen_nn_ops.conv2d_backprop_input(
        s, kernel, upstream, **attributes), tf.constant([2, 2])),
}
# ... and a scalar output gradient beside them: TensorFlow's error type.
bad = dict(input_sizes=tf.constant([65534, 65534]), filter=tf.fill([3, 3, 2, 2], 0.1),
           out_backprop=tf.constant(0.0), strides=[1, 1, 1, 1], padding="SAME")
out["two_sizes_invalid"] = [
    error(lambda: gen_nn_ops.conv2d_backprop_input(**bad)),
    error(lambda: conv["conv2d_backprop_input"].tensorflows(**bad)),
]

# Convolutions with an empty dimension: TensorFlow's empty or zero results.
def both(op, *args, **kwargs):
    patched = getattr(gen_nn_ops, op)(*args, **kwargs)
    own = conv[op].tensorflows(*args, **kwargs)
    return {"found": patched.numpy().tolist(), "shape": patched.shape.as_list(),
            "expected": own.numpy().tolist(), "expected_shape": own.shape.as_list()}

out["empty"] = {
    # The output gradient has no columns: the input gradient is zeros.
    "backprop_input_degenerate": both(
        "conv2d_backprop_input", [3, 1, 1, 2], tf.ones([1, 3, 2, 3]),
        tf.ones([3, 1, 0, 3]), strides=[1, 1, 2, 1], padding="VALID"),
    "backprop_input_no_batch": both(
        "conv2d_backprop_input", [0, 2, 3, 1], tf.ones([2, 2, 1, 1]),
        tf.ones([0, 1, 2, 1]), strides=[1, 1, 1, 1], padding="VALID"),
    "forward_no_batch": both(
        "conv2d", tf.ones([0, 2, 3, 3]), tf.ones([1, 1, 3, 3]),
        strides=[1, 1, 1, 1], padding="VALID"),
    # No rows, padded by one on each side: zeros.
    "forward_only_padding": both(
        "conv2d", tf.ones([1, 0, 2, 1]), tf.ones([1, 1, 1, 1]),
        strides=[1, 1, 1, 1], padding="EXPLICIT",
        explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0]),
    "backprop_filter_no_batch": both(
        "conv2d_backprop_filter", tf.ones([0, 2, 3, 1]), [2, 2, 1, 1],
        tf.ones([0, 1, 2, 1]), strides=[1, 1, 1, 1], padding="VALID"),
}

# Shapes that cannot multiply: TensorFlow's error type and text.
mat_mul_tf = fixed_order_products._MAT_MUL.tensorflows
batch_tf = fixed_order_products._BATCH_MAT_MUL["batch_mat_mul_v2"].tensorflows
vector, matrix = tf.constant([10.0, 20.0, 30.0]), tf.constant([[40.0, 50.0], [60.0, 70.0]])
row = tf.constant([[10.0, 20.0, 30.0]])
out["mismatch"] = {
    "rank": [error(lambda: vector @ matrix), error(lambda: mat_mul_tf(vector, matrix))],
    "inner": [error(lambda: row @ matrix), error(lambda: mat_mul_tf(row, matrix))],
    "batch": [
        error(lambda: gen_math_ops.batch_mat_mul_v2(tf.ones([2, 2, 3]), tf.ones([3, 3, 3]))),
        error(lambda: batch_tf(tf.ones([2, 2, 3]), tf.ones([3, 3, 3]))),
    ],
    "traced": [
        error(lambda: tf.function(lambda: row @ matrix)()),
        error(lambda: tf.function(lambda: mat_mul_tf(row, matrix))()),
    ],
}
# A product that fits still is the kernel's.
out["product_ops"] = ops_of(lambda a, b: a @ b, row, tf.ones([3, 2]))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cases() -> dict:
    done = run_python(CASES, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    result = last_json_line(done.stdout)
    assert set(HARNESS.EXPECTED_KERNELS) <= set(result["kernels"]), result["kernels"]
    return result


@pytest.mark.parametrize(
    "equation",
    [
        "...ij,...jk->...ik",
        "i...j,j...k->...ik",
        "...abc,...abcd->...d",
        "i...j,j...k->i...k",
    ],
)
def test_einsum_broadcasts_a_batch_dimension_of_one(cases, equation) -> None:
    case = cases["einsum"][equation]
    assert case["shapes"][0] == case["shapes"][1]
    # TensorFlow's values to float32 rounding (the kernel sums in its order).
    assert case["error"] <= 1e-5 * max(1.0, case["scale"]), case
    assert case["gradient_error"] <= 1e-4, case
    # The kernel computed it: not left to TensorFlow's Einsum.
    assert "TfdetFixedOrderBatchMatMul" in case["ops"], case["ops"]
    assert "Einsum" not in case["ops"], case["ops"]


def test_einsum_identity_has_the_identity_gradient(cases) -> None:
    found = cases["einsum_identity_gradient"]
    assert set(found) == {"graph", "eager"}, found
    for theoretical, numerical in found.values():
        np.testing.assert_allclose(theoretical, [[[1.0]]])
        np.testing.assert_allclose(numerical, [[[1.0]]], rtol=1e-3)


def test_conv2d_backprop_input_takes_height_and_width(cases) -> None:
    case = cases["two_sizes"]
    np.testing.assert_allclose(case["found"], case["expected"], rtol=1e-6)
    np.testing.assert_allclose(np.ravel(case["found"]), [5.0, 11.0, 17.0, 23.0])
    assert "TfdetFixedOrderConv2DBackpropInput" in case["ops"], case["ops"]
    assert "Conv2DBackpropInput" not in case["ops"], case["ops"]


def test_conv2d_backprop_input_raises_tensorflows_error_type(cases) -> None:
    found, expected = cases["two_sizes_invalid"]
    assert expected is not None
    assert found is not None and found[0] == expected[0], (found, expected)


@pytest.mark.parametrize(
    "case",
    [
        "backprop_input_degenerate",
        "backprop_input_no_batch",
        "forward_no_batch",
        "forward_only_padding",
        "backprop_filter_no_batch",
    ],
)
def test_convolution_with_an_empty_dimension_is_tensorflows(cases, case) -> None:
    result = cases["empty"][case]
    assert result["shape"] == result["expected_shape"]
    assert result["found"] == result["expected"]


@pytest.mark.parametrize("case", ["rank", "inner", "batch", "traced"])
def test_mismatched_product_raises_tensorflows_error(cases, case) -> None:
    found, expected = cases["mismatch"][case]
    assert expected is not None
    assert found == expected


def test_a_product_that_fits_is_the_kernels(cases) -> None:
    assert "TfdetFixedOrderMatMul" in cases["product_ops"], cases["product_ops"]
    assert "MatMul" not in cases["product_ops"], cases["product_ops"]


def test_erfc_in_a_tf1_graph_first(cases) -> None:
    """portable_kernels checks its kernel against the composition at the first
    Erfc; under a TF1 graph that check ran there and failed (no numpy())."""
    case = cases["erfc_tf1"]
    np.testing.assert_allclose(case["found"], case["expected"], rtol=1e-6)


def test_harness_lists_tensorflows_own_tests() -> None:
    """Every module names a file of kernel_tests/ or a wrapper of the wheel's."""
    for name, module in HARNESS.MODULES.items():
        assert (module.path is None) != (module.source is None), name
    assert json.dumps(HARNESS.KNOWN_DIFFERENCES)  # reasons are text
