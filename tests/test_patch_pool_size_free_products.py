"""`pool_size_free_products`: weights that do not follow the thread-pool size.

Under the default profile, `MatMul` (oneDNN's sgemm), `BatchMatMul` and
`Einsum`, `Conv2DBackpropFilter`, `Conv2DBackpropInput` (strided),
`DepthwiseConv2dNativeBackpropFilter` and `BiasAddGrad` give other bits
with another pool size. With the opt-in patch, a fresh process per pool
size (1, 2, 3, 6) trains a Keras 3 built-in, the survey's attention model,
a model whose shapes cross the libraries' splitting thresholds and one of
depthwise convolutions to the same weights; the control, the same processes
before the patch is installed, trains them to other weights. Op by op, the
replacements agree with TensorFlow's ops to float32 rounding, leave the
inputs they cannot compute to them, and compute element-wise functions the
same way whatever the tensor's length (tests/test_batch_invariance.py
shows what that buys: each sample's bits whatever its batch).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import (
    REPO,
    TENSORFLOW_PRODUCTS,
    clean_env,
    last_json_line,
    run_checks_side_by_side,
    run_python,
)
from tfdet._patching import _hazards
from tfdet.patches import pool_size_free_products

# Odd pool sizes, and 6: channel counts that do not divide by them. (4 and 8
# were there too, at a third more of the suite's slowest test: 2 stands for
# the powers of two.)
POOL_SIZES = (1, 2, 3, 6)
# Convolutions with BatchNormalization and a Dense head; attention's einsums;
# a stride-2 convolution whose input gradient oneDNN splits by the pool;
# depthwise and separable convolutions, whose filter gradient TensorFlow
# splits by images. (builtin:cnn and the whole survey: docs/measurements.md,
# "Thread pools".)
MODELS = (
    "builtin:bn_gelu",
    f"{REPO / 'benchmarks' / 'survey_models.py'}:multi_head_attention",
    f"{REPO / 'benchmarks' / 'split_models.py'}:stride_two_cnn",
    f"{REPO / 'benchmarks' / 'split_models.py'}:depthwise_cnn",
)

# One process per pool size: the weights of each model after 3 steps, first
# without the patch (the control), then with it.
TRAIN = """
import hashlib, json, sys
import numpy as np
import tfdet
from tfdet._target import _load
from tfdet._patching import _registry
# TensorFlow's own products first (the control), then the patch.
tfdet.enable(seed=0, threads=int(sys.argv[1]), patches=TENSORFLOW_PRODUCTS)

def digests():
    found = {}
    for name in sys.argv[2].split(","):
        built = _load.build(name, seed=0)
        for step in range(3):
            built.model.train_on_batch(*built.batch(step))
        sha = hashlib.sha256()
        for weight in built.model.get_weights():
            sha.update(np.ascontiguousarray(weight).tobytes())
        found[name] = sha.hexdigest()[:16]
    return found

plain = digests()
_registry.install(["pool_size_free_products"])
print(json.dumps({"plain": plain, "patched": digests()}))
""".replace("TENSORFLOW_PRODUCTS", repr(TENSORFLOW_PRODUCTS.split(",")))


def test_weights_do_not_follow_the_pool_size_only_with_the_patch():
    processes = {
        threads: subprocess.Popen(
            [sys.executable, "-c", TRAIN, str(threads), ",".join(MODELS)],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads in POOL_SIZES
    }
    results = {}
    for threads, process in processes.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, err[-3000:]
        results[threads] = last_json_line(out)
    for model in MODELS:
        patched = {threads: r["patched"][model] for threads, r in results.items()}
        plain = {threads: r["plain"][model] for threads, r in results.items()}
        assert len(set(patched.values())) == 1, (model, patched)
        # The control: without the patch the pool size decides the weights.
        assert len(set(plain.values())) > 1, (model, plain)


# tf_keras's BatchNormalization, one process per pool size: the weights of a
# Conv2D + BatchNormalization model after 3 steps under the patch, then the
# control: the same patch with the layer left fused.
TF_KERAS_BATCH_NORM = """
import hashlib, json, sys
import numpy as np
import tfdet
tfdet.enable(seed=0, threads=int(sys.argv[1]),
             patches=["auto", "pool_size_free_products"])
import tf_keras as keras
from tf_keras.src.layers.normalization import batch_normalization
from tfdet.patches import pool_size_free_products as patch

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 16, 16, 3)).astype("float32")
y = rng.integers(0, 4, size=(64,))

def digest():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.layers.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
        keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    for step in range(3):
        model.train_on_batch(x[16 * step:16 * step + 32], y[16 * step:16 * step + 32])
    fused = [l.fused for l in model.layers if "batch_norm" in l.name]
    sha = hashlib.sha256()
    for weight in model.get_weights():
        sha.update(np.ascontiguousarray(weight).tobytes())
    return sha.hexdigest()[:16], fused

patched = digest()
base = batch_normalization.BatchNormalizationBase
base.build = next(o for owner, name, o in patch.PATCH.replaced() if owner is base)
print(json.dumps({"patched": patched, "fused": digest()}))
"""


def test_tf_keras_batch_norm_does_not_follow_the_pool_size_with_the_patch():
    pytest.importorskip("tf_keras")
    processes = {
        threads: subprocess.Popen(
            [sys.executable, "-c", TF_KERAS_BATCH_NORM, str(threads)],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads in (1, 2)
    }
    results = {}
    for threads, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[threads] = last_json_line(out)
    patched = {threads: r["patched"] for threads, r in results.items()}
    fused = {threads: r["fused"] for threads, r in results.items()}
    assert all(layers == [False] for _, layers in patched.values()), patched
    assert len({digest for digest, _ in patched.values()}) == 1, patched
    # The control: the fused kernel's batch sums follow the pool size.
    assert all(layers == [True] for _, layers in fused.values()), fused
    assert len({digest for digest, _ in fused.values()}) > 1, fused


# Keras 3's Conv2DTranspose, one process per pool size: weights after a fit
# whose last batch is partial (8 of 40 samples after two of 16), and the
# predictions at batch sizes 1, 5 and 16; without the patch (the control),
# then with it. What the patch leaves to TensorFlow's ops is said on
# tfdet's logger.
CONV_TRANSPOSE = """
import hashlib, json, logging, sys
import numpy as np
import tfdet
from tfdet._patching import _registry
# TensorFlow's own products first (the control), then the patch.
tfdet.enable(seed=0, threads=int(sys.argv[1]), patches=TENSORFLOW_PRODUCTS)
import keras

left = []
class Keep(logging.Handler):
    def emit(self, record):
        left.append(record.getMessage())
logging.getLogger("tfdet").addHandler(Keep())

rng = np.random.default_rng(0)
x = rng.normal(size=(40, 12, 12, 8)).astype("float32")
y = rng.normal(size=(40, 4)).astype("float32")

def bits(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]

def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.layers.Input((12, 12, 8)),
        keras.layers.Conv2DTranspose(24, 3, strides=2, padding="same"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return {
        "weights": bits(np.concatenate([w.ravel() for w in model.get_weights()])),
        "predictions": [bits(model.predict(x, batch_size=size, verbose=0))
                        for size in (1, 5, 16)],
    }

plain = run()
_registry.install(["pool_size_free_products"])
print(json.dumps({"plain": plain, "patched": run(),
                  "left": [message for message in left if "leaves" in message]}))
""".replace("TENSORFLOW_PRODUCTS", repr(TENSORFLOW_PRODUCTS.split(",")))


@pytest.mark.slow
def test_conv2d_transpose_trains_and_predicts_at_any_batch_apart_from_the_pool_size():
    # Before: `predict` at a new batch size and `fit` with a partial last
    # batch (a step traced with an unknown batch) raised "TypeError: int()
    # argument must be ... not 'SymbolicTensor'"; with that fixed, the
    # kernel's gradient went to TensorFlow's Conv2DBackpropFilter (the
    # channels lost their static size) and 2 threads trained other weights
    # than 1 and 3 (so 1 and 2 show the fault and the control).
    processes = {
        threads: subprocess.Popen(
            [sys.executable, "-c", CONV_TRANSPOSE, str(threads)],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads in (1, 2)
    }
    results = {}
    for threads, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[threads] = last_json_line(out)
    assert all(r["left"] == [] for r in results.values()), results
    patched = [r["patched"] for r in results.values()]
    plain = [r["plain"] for r in results.values()]
    assert len({r["weights"] for r in patched}) == 1, results
    assert all(len(set(r["predictions"])) == 1 for r in patched), results
    # The controls: without the patch the pool size decides the weights,
    # and the batch size the predictions' bits.
    assert len({r["weights"] for r in plain}) > 1, results
    assert any(len(set(r["predictions"])) > 1 for r in plain), results


CHECKS = """
import json
import numpy as np
import tfdet
tfdet.enable(seed=0, patches=["auto", "pool_size_free_products"])
import tensorflow as tf
from tfdet.patches import _convolution_compositions, _product_compositions

import logging
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("tfdet").addHandler(Keep())

rng = np.random.default_rng(0)
def arr(*shape, dtype=np.float32):
    return tf.constant(rng.standard_normal(shape).astype(dtype))

def with_grads(fn, *inputs):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        y = fn(*inputs)
        loss = tf.reduce_sum(y * y)
    return [y, *tape.gradient(loss, list(inputs))]

def graph_ops(fn, *inputs):
    traced = tf.function(lambda *xs: with_grads(fn, *xs)).get_concrete_function(*inputs)
    return {op.type for op in traced.graph.get_operations()}

def worst(got, want):
    return max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-30))
               for g, w in zip(got, want))

originals = {"mat_mul": _product_compositions.MAT_MUL.original,
             "conv2d_backprop_filter": _convolution_compositions.FILTER_GRAD.original,
             "bias_add_grad": _convolution_compositions.BIAS_GRAD.original}
cases = {
    "matmul": (tf.matmul, (arr(33, 70), arr(70, 9))),
    "matmul transposed": (lambda a, b: tf.matmul(a, b, transpose_a=True,
                          transpose_b=True), (arr(70, 33), arr(9, 70))),
    "conv same stride 2": (lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"),
                           (arr(4, 9, 11, 3), arr(3, 3, 3, 5))),
    "conv valid dilated": (lambda x, w: tf.nn.conv2d(x, w, 1, "VALID", dilations=2),
                           (arr(4, 9, 11, 3), arr(3, 2, 3, 5))),
    "conv explicit": (lambda x, w: tf.nn.conv2d(
        x, w, 1, [[0, 0], [1, 2], [0, 1], [0, 0]]), (arr(4, 9, 11, 3), arr(2, 3, 3, 5))),
    "batch matmul": (lambda a, b: tf.matmul(a, b, adjoint_b=True),
                     (arr(3, 4, 10, 6), arr(3, 4, 7, 6))),
    "einsum": (lambda a, b: tf.einsum("aecd,abcd->acbe", a, b),
               (arr(2, 9, 4, 6), arr(2, 7, 4, 6))),
    "conv one image": (lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
                       (arr(1, 9, 11, 3), arr(3, 3, 3, 5))),
    "conv stride 3": (lambda x, w: tf.nn.conv2d(x, w, 3, "SAME"),
                      (arr(2, 12, 13, 4), arr(5, 5, 4, 6))),
    "conv 1x1 stride 2": (lambda x, w: tf.nn.conv2d(x, w, 2, "VALID"),
                          (arr(3, 8, 8, 8), arr(1, 1, 8, 3))),
    "conv transpose": (lambda x, w: tf.nn.conv2d_transpose(x, w, [2, 9, 11, 3], 2,
                       "SAME"), (arr(2, 5, 6, 4), arr(3, 3, 3, 4))),
    "batch matmul broadcast": (tf.matmul, (arr(3, 1, 5, 6), arr(4, 6, 7))),
    "bias_add": (tf.nn.bias_add, (arr(6, 5, 4, 8), arr(8))),
    "bias_add NCHW": (lambda x, b: tf.nn.bias_add(x, b, data_format="NCHW"),
                      (arr(6, 8, 5, 4), arr(8))),
    "depthwise same": (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1],
                       "SAME"), (arr(4, 9, 11, 5), arr(3, 3, 5, 1))),
    "depthwise stride 2 multiplier 3": (lambda x, w: tf.nn.depthwise_conv2d(
        x, w, [1, 2, 2, 1], "VALID"), (arr(3, 12, 13, 4), arr(3, 2, 4, 3))),
    "depthwise dilated": (lambda x, w: tf.nn.depthwise_conv2d(
        x, w, [1, 1, 1, 1], "SAME", dilations=[2, 2]), (arr(2, 10, 9, 6), arr(3, 3, 6, 2))),
    "depthwise explicit": (lambda x, w: tf.raw_ops.DepthwiseConv2dNative(
        input=x, filter=w, strides=[1, 1, 1, 1], padding="EXPLICIT",
        explicit_paddings=[0, 0, 1, 2, 0, 1, 0, 0]), (arr(2, 7, 8, 3), arr(2, 3, 3, 2))),
}
REPLACED = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
            "Conv2DBackpropFilter", "Conv2DBackpropInput", "BiasAddGrad",
            "DepthwiseConv2dNativeBackpropFilter"}
report = {}
for name, (fn, inputs) in cases.items():
    patched = with_grads(fn, *inputs)
    ops = graph_ops(fn, *inputs)
    from tfdet._patching import _registry
    _registry.restore(["pool_size_free_products"])
    original = with_grads(fn, *inputs)
    _registry.install(["pool_size_free_products"])
    report[name] = {"error": worst(patched, original),
                    "replaced": sorted(ops & REPLACED)}
# Traced with an unknown batch, as Keras traces a step: still replaced.
spec = [tf.TensorSpec([None, 4, 10, 6]), tf.TensorSpec([None, 4, 7, 6])]
traced = tf.function(lambda a, b: tf.matmul(a, b, adjoint_b=True),
                     input_signature=spec).get_concrete_function()
report["unknown batch"] = {
    "replaced": sorted({op.type for op in traced.graph.get_operations()} & REPLACED)}
# Keras 3's Conv2DTranspose passes its output shape as a list whose batch is
# a tensor when traced with an unknown batch; with its gradients.
transpose = lambda x, w: tf.nn.conv2d_transpose(
    x, w, [tf.shape(x)[0], 9, 11, 3], 2, "SAME")
traced = tf.function(lambda x, w: with_grads(transpose, x, w), input_signature=[
    tf.TensorSpec([None, 5, 6, 4]), tf.TensorSpec([3, 3, 3, 4])]).get_concrete_function()
# Its one-image case is a tf.cond: the ops of its branches, and of their
# gradients, are in the graph's function library.
graph_def = traced.graph.as_graph_def()
types = {node.op for node in graph_def.node} | {
    node.op for function in graph_def.library.function for node in function.node_def}
report["unknown batch transpose"] = {"replaced": sorted(types & REPLACED)}
# What the replacements cannot compute goes to TensorFlow's op, which gives
# its result (the same bits) instead of an error.
fallbacks = {
    "einsum ii->i": (lambda a: tf.einsum("ii->i", a), (arr(4, 4),)),
    "einsum ii->": (lambda a: tf.einsum("ii->", a), (arr(4, 4),)),
    "einsum iij,jk->ik": (lambda a, b: tf.einsum("iij,jk->ik", a, b),
                          (arr(3, 3, 4), arr(4, 2))),
    "matmul zero inner": (tf.matmul, (arr(3, 0), arr(0, 4))),
    "matmul zero outer": (tf.matmul, (arr(3, 5), arr(5, 0))),
    "grouped conv": (lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"),
                     (arr(2, 6, 6, 4), arr(3, 3, 2, 6))),
}
for name, (fn, inputs) in fallbacks.items():
    patched = with_grads(fn, *inputs)
    _registry.restore(["pool_size_free_products"])
    original = with_grads(fn, *inputs)
    _registry.install(["pool_size_free_products"])
    report[name] = {"same": all(np.array_equal(p, o)
                                for p, o in zip(patched, original))}
# Element-wise functions: an element's bits whatever its tensor's length
# (computed whole, then in pieces of 7), with the patch and without it.
x = arr(1000) * 3.0
# Each looked up when called: `tf.sin` is the generated wrapper itself, and
# the patch replaces it in `tf`'s namespace too.
elementwise = {
    "sigmoid": lambda t: tf.sigmoid(t), "exp": lambda t: tf.exp(t),
    "log": lambda t: tf.math.log(tf.abs(t)),
    "log1p": lambda t: tf.math.log1p(tf.abs(t)), "expm1": lambda t: tf.math.expm1(t),
    "softplus": lambda t: tf.nn.softplus(t), "elu": lambda t: tf.nn.elu(t),
    "selu": lambda t: tf.nn.selu(t), "sin": lambda t: tf.sin(t),
    "cos": lambda t: tf.cos(t), "pow": lambda t: tf.pow(tf.abs(t), 1.7),
    "gelu": lambda t: tf.nn.gelu(t),
    "gelu exact": lambda t: tf.nn.gelu(t, approximate=False),
}
def same_in_pieces(fn):
    pieces = tf.concat([fn(x[i : i + 7]) for i in range(0, 1000, 7)], 0)
    return bool(np.array_equal(np.asarray(fn(x)).view(np.uint32),
                               np.asarray(pieces).view(np.uint32)))
report["elementwise"] = {}
# portable_math (in "auto") puts these functions on whole packets too: the
# control leaves both out.
both = [n for n in ("pool_size_free_products", "portable_math")
        if n in _registry.installed()]
for name, fn in elementwise.items():
    patched = same_in_pieces(fn)
    _registry.restore(both)
    original = same_in_pieces(fn)
    _registry.install(both)
    report["elementwise"][name] = {"patched": patched, "original": original}
# tf.nn.gelu's exact form: the same bits eagerly and traced (TF 2.16-2.18
# divide by sqrt(2), which Grappler turns into a multiplication when traced).
exact = lambda t: tf.nn.gelu(t, approximate=False)
report["gelu traced"] = {"same": bool(np.array_equal(
    np.asarray(exact(x)).view(np.uint32),
    np.asarray(tf.function(exact)(x)).view(np.uint32)))}
# float64 is left to the original op: the same bits.
a, b = arr(5, 7, dtype=np.float64), arr(7, 3, dtype=np.float64)
report["float64"] = {"same": bool(np.array_equal(tf.matmul(a, b),
                                                 originals["mat_mul"](a, b)))}
tf.matmul(a, b)
report["warnings"] = warnings
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def checks() -> dict:
    result = run_python(CHECKS, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)


@pytest.mark.parametrize(
    "case",
    [
        "matmul",
        "matmul transposed",
        "conv same stride 2",
        "conv valid dilated",
        "conv explicit",
        "conv one image",
        "conv stride 3",
        "conv 1x1 stride 2",
        "conv transpose",
        "batch matmul",
        "batch matmul broadcast",
        "einsum",
        "bias_add",
        "bias_add NCHW",
        "depthwise same",
        "depthwise stride 2 multiplier 3",
        "depthwise dilated",
        "depthwise explicit",
    ],
)
def test_values_agree_with_the_original_and_the_op_is_gone(checks, case):
    # Another summation order: float32 rounding apart, not more.
    assert checks[case]["error"] < 1e-5, checks[case]
    # Traced in a tf.function (forward and gradients), none of the three
    # ops is left in the graph.
    assert checks[case]["replaced"] == [], checks[case]


def test_other_dtypes_go_to_the_original_op(checks):
    assert checks["float64"]["same"]


def test_what_loses_the_property_is_said_once(checks):
    left = [w for w in checks["warnings"] if "leaves" in w]
    # float64 MatMul twice, the diagonal equations: once each; an empty
    # product or an integer one loses nothing and says nothing.
    assert sum("MatMul on float64" in w for w in left) == 1, left
    assert any("Einsum on the equation 'ii->i'" in w for w in left), left
    assert not any("int" in w for w in left), left


def test_exact_gelu_has_the_same_bits_eagerly_and_traced(checks):
    # `model(x)` against `model.predict(x)`; the control is TensorFlow
    # 2.16-2.18's own gelu (the version matrix's oldest combination), whose
    # division Grappler rewrites: 96 of 96 rows of a Dense(64, "gelu").
    assert checks["gelu traced"]["same"]


def test_a_batch_unknown_when_traced_is_still_replaced(checks):
    # Falling back for it gave other bits than the same product traced with
    # a known batch: Keras's predict at batch 96 and then 32 disagreed.
    assert checks["unknown batch"]["replaced"] == []
    # A transposed convolution's: it raised a TypeError ('SymbolicTensor'),
    # then left its filter gradient to Conv2DBackpropFilter.
    assert checks["unknown batch transpose"]["replaced"] == []


@pytest.mark.parametrize(
    "case",
    [
        "einsum ii->i",
        "einsum ii->",
        "einsum iij,jk->ik",
        "matmul zero inner",
        "matmul zero outer",
        "grouped conv",
    ],
)
def test_what_the_patch_cannot_compute_goes_to_tensorflow(checks, case):
    # Each raised inside the patch before ("Subscript not supported", "filter
    # must not have zero elements", a reshape error).
    assert checks[case]["same"], checks[case]


def test_element_wise_bits_do_not_follow_the_tensor_length_only_with_the_patch(
    checks,
):
    found = checks["elementwise"]
    assert {name: r["patched"] for name, r in found.items()} == dict.fromkeys(
        found, True
    )
    # The control: TensorFlow's kernels compute the last `length % lanes`
    # elements with the scalar function, which for these gives other bits.
    # (GELU is built of them in a way that changed with the version: erf,
    # whose paths agree, until TensorFlow 2.18; erfc since.)
    primitives = {name: r for name, r in found.items() if "gelu" not in name}
    assert {name: r["original"] for name, r in primitives.items()} == dict.fromkeys(
        primitives, False
    )


def test_check_with_the_patch_passes_the_threads_perturbation(tmp_path):
    # Run 1 trains with another pool size. With the patch: identical; the
    # control, the same check without it: diverged, the pool size named as
    # the cause and the model's ops that follow it named.
    outputs, codes, reports = run_checks_side_by_side(
        ["builtin:bn_gelu", "--steps", "2", "--device", "cpu", "--perturb",
         "threads"],
        {
            "with": ["--patches", "auto,pool_size_free_products", "--no-attribute"],
            "without": ["--patches", TENSORFLOW_PRODUCTS],
        },
        tmp_path,
    )  # fmt: skip
    assert codes == {"with": 0, "without": 1}, outputs
    report = reports["with"]
    assert report["patches"] == ["auto", "pool_size_free_products"]
    # Another pool size is a setting, not another machine: never "imitated".
    assert list(report["varied"]) == ["threads"] and not report["imitated"]
    assert "also varied (not another machine): threads" in outputs["with"]
    baseline, other = report["devices"]["cpu"]["runs"]
    assert (
        baseline["profile"]["intra_op_threads"] != other["profile"]["intra_op_threads"]
    )
    assert "pool_size_free_products" in other["profile"]["patches"]
    attribution = reports["without"]["devices"]["cpu"]["divergence"]["attribution"]
    assert attribution["responsible"] == ["threads"]
    # bn_gelu's convolutions and Dense layers (with their biases): the ops
    # of the model that can follow the pool size.
    assert attribution["pool_size_ops"] == [
        "BiasAddGrad",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "MatMul",
    ]
    assert "pool_size_free_products" in attribution["verdict"]
    assert (
        "BiasAddGrad, Conv2DBackpropFilter, Conv2DBackpropInput, MatMul"
        in outputs["without"]
    )


def test_the_table_says_every_covered_op_follows_the_pool_size():
    # A check names the patch for exactly these ops when the pool size
    # separates two runs; the table must know each of them.
    covered = pool_size_free_products.COVERED
    assert _hazards.pool_size_dependent(covered, "2.21.0") == tuple(sorted(covered))


@pytest.mark.parametrize("onednn", [True, False, None])
def test_says_once_that_without_onednn_the_bits_may_follow_the_pool_size(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, onednn
) -> None:
    # Measured on emulated aarch64, where enable() leaves oneDNN off: the
    # built-in CNN's weights differed between pools of 1 and 3 under the patch.
    from tfdet._patching import _exact_math
    from tfdet._pin import _environment

    monkeypatch.setattr(_environment, "onednn_custom_ops", lambda: onednn)
    monkeypatch.setattr(_exact_math, "_WARNED", set())
    with caplog.at_level("WARNING", logger="tfdet"):
        pool_size_free_products.warn_without_onednn()
        pool_size_free_products.warn_without_onednn()
    said = [
        r.getMessage()
        for r in caplog.records
        if "oneDNN custom ops are off" in r.getMessage()
    ]
    assert len(said) == (1 if onednn is False else 0)
