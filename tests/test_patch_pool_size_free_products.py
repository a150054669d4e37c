"""`pool_size_free_products`: weights that do not follow the thread-pool size.

Under the default profile, `MatMul` (oneDNN's sgemm), `BatchMatMul` and
`Einsum`, `Conv2DBackpropFilter` and `BiasAddGrad` give other bits with
another pool size. With the opt-in patch, a fresh process per pool size (1,
2, 3, 4, 8) trains a Keras 3 built-in and the survey's attention model to
the same weights; the control, the same processes before the patch is
installed, trains them to other weights.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env, last_json_line, run_python
from tfdet.patches import _hazards, pool_size_free_products

POOL_SIZES = (1, 2, 3, 4, 8)
# Convolutions with BatchNormalization and a Dense head; attention's einsums.
# (builtin:cnn and the whole survey: docs/measurements.md, "Thread pools".)
MODELS = (
    "builtin:bn_gelu",
    f"{REPO / 'benchmarks' / 'survey_models.py'}:multi_head_attention",
)

# One process per pool size: the weights of each model after 3 steps, first
# without the patch (the control), then with it.
TRAIN = """
import hashlib, json, sys
import numpy as np
import tfdet
from tfdet._runs import _target
from tfdet.patches import _registry
tfdet.enable(seed=0, threads=int(sys.argv[1]))

def digests():
    found = {}
    for name in sys.argv[2].split(","):
        built = _target.build(name, seed=0)
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
"""


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


CHECKS = """
import json
import numpy as np
import tfdet
tfdet.enable(seed=0, patches=["auto", "pool_size_free_products"])
import tensorflow as tf
from tfdet.patches import pool_size_free_products as patch

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

originals = {"mat_mul": patch._MAT_MUL.original,
             "conv2d_backprop_filter": patch._FILTER_GRAD.original,
             "bias_add_grad": patch._BIAS_GRAD.original}
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
    "bias_add": (tf.nn.bias_add, (arr(6, 5, 4, 8), arr(8))),
    "bias_add NCHW": (lambda x, b: tf.nn.bias_add(x, b, data_format="NCHW"),
                      (arr(6, 8, 5, 4), arr(8))),
}
REPLACED = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
            "Conv2DBackpropFilter", "BiasAddGrad"}
report = {}
for name, (fn, inputs) in cases.items():
    patched = with_grads(fn, *inputs)
    ops = graph_ops(fn, *inputs)
    from tfdet.patches import _registry
    _registry.restore(["pool_size_free_products"])
    original = with_grads(fn, *inputs)
    _registry.install(["pool_size_free_products"])
    report[name] = {"error": worst(patched, original),
                    "replaced": sorted(ops & REPLACED)}
# float64 is left to the original op: the same bits.
a, b = arr(5, 7, dtype=np.float64), arr(7, 3, dtype=np.float64)
report["float64"] = {"same": bool(np.array_equal(tf.matmul(a, b),
                                                 originals["mat_mul"](a, b)))}
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
        "batch matmul",
        "einsum",
        "bias_add",
        "bias_add NCHW",
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


def test_check_with_the_patch_passes_the_threads_perturbation(tmp_path):
    # Run 1 trains with another pool size. With the patch: identical; the
    # control, the same check without it: diverged, the pool size named as
    # the cause and the model's ops that follow it named.
    common = [
        sys.executable, "-m", "tfdet", "check", "builtin:bn_gelu", "--steps", "2",
        "--device", "cpu", "--perturb", "threads",
    ]  # fmt: skip
    patches = {
        "with": ["--patches", "auto,pool_size_free_products", "--no-attribute"],
        "without": ["--patches", "auto"],
    }
    processes = {
        name: subprocess.Popen(
            [*common, "--json", str(tmp_path / name), *flags],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, flags in patches.items()
    }
    outputs = {name: p.communicate(timeout=900)[0] for name, p in processes.items()}
    codes = {name: p.returncode for name, p in processes.items()}
    assert codes == {"with": 0, "without": 1}, outputs
    report = json.loads((tmp_path / "with").read_text())
    assert report["patches"] == ["auto", "pool_size_free_products"]
    # Another pool size is a setting, not another machine: never "imitated".
    assert list(report["varied"]) == ["threads"] and not report["imitated"]
    assert "also varied (not another machine): threads" in outputs["with"]
    baseline, other = report["devices"]["cpu"]["runs"]
    assert (
        baseline["profile"]["intra_op_threads"] != other["profile"]["intra_op_threads"]
    )
    assert "pool_size_free_products" in other["profile"]["patches"]
    attribution = json.loads((tmp_path / "without").read_text())["devices"]["cpu"][
        "divergence"
    ]["attribution"]
    assert attribution["responsible"] == ["threads"]
    # bn_gelu's convolutions and Dense layers (with their biases).
    assert attribution["pool_size_ops"] == [
        "BiasAddGrad",
        "Conv2DBackpropFilter",
        "MatMul",
    ]
    assert "pool_size_free_products" in attribution["verdict"]
    assert "BiasAddGrad, Conv2DBackpropFilter, MatMul" in outputs["without"]


def test_the_table_says_every_covered_op_follows_the_pool_size():
    # A check names the patch for exactly these ops when the pool size
    # separates two runs; the table must know each of them.
    covered = pool_size_free_products.COVERED
    assert _hazards.pool_size_dependent(covered, "2.21.0") == tuple(sorted(covered))
