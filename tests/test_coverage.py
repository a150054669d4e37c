"""What the default covers, measured: `tfdet.coverage()`, `enable()`'s log,
`Profile.tiers(coverage=...)`, and `tfdet check`'s report.

The claim is checked against the bits: where the coverage says TensorFlow's
own op is left (a bfloat16 MatMul under a mixed-precision policy), that op's
bits do follow the pool (the control); where it says every op is covered,
the same product in float32 gives one digest at every pool.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import clean_env, run_python, run_tfdet
from tfdet._pin._tiers import POOL_SIZE_FREE
from tfdet._setup import _coverage

ALL_CPU_TIERS = ("this-machine", "any-thread-count", "any-x86-cpu", "any-batch")


def _default_profile(**fields):
    profile = {
        "op_determinism": True,
        "intra_op_threads": 4,
        "patches": ["auto", POOL_SIZE_FREE],
        "cpu_isa": "AVX2",
        "xla_cpu_isa": "AVX2",
        "tensorflow_version": "2.21.0",
    }
    return {**profile, **fields}


# --- The rules, from a profile and the ops a model traced -------------------


def test_every_covered_op_keeps_every_tier():
    ran = {"TfdetFixedOrderMatMul", "TfdetFixedOrderConv2D", "Mul", "Exp"}
    coverage = _coverage.of(_default_profile(), ran)
    assert coverage == _coverage.Coverage()
    assert "every op" in coverage.describe()


def test_a_pool_size_dependent_op_takes_the_thread_tiers():
    coverage = _coverage.of(_default_profile(), {"Conv3DBackpropFilterV2", "Mul"})
    assert [(op.op, op.follows, op.why) for op in coverage.uncovered] == [
        ("Conv3DBackpropFilterV2", (_coverage.POOL,), "traced")
    ]
    assert coverage.lost == ("any-thread-count", "any-x86-cpu")
    # One thread is the pool every machine runs alike: nothing is lost.
    assert (
        _coverage.of(
            _default_profile(intra_op_threads=1), {"Conv3DBackpropFilterV2"}
        ).lost
        == ()
    )


def test_a_product_left_to_tensorflow_takes_the_batch_and_at_one_thread_only_it():
    left = [("MatMul", "bfloat16"), ("BiasAddGrad", "bfloat16")]
    ran = {"MatMul", "BiasAddGrad"}
    coverage = _coverage.of(_default_profile(), ran, left)
    assert [(op.op, op.follows, op.why) for op in coverage.uncovered] == [
        ("BiasAddGrad", (_coverage.POOL,), "bfloat16"),
        ("MatMul", (_coverage.POOL, _coverage.BATCH), "bfloat16"),
    ]
    assert coverage.lost == ("any-thread-count", "any-x86-cpu", "any-batch")
    single = _coverage.of(_default_profile(intra_op_threads=1), ran, left)
    # A gradient decides no prediction; at one thread the pool decides nothing.
    assert [op.op for op in single.uncovered] == ["MatMul"]
    assert single.lost == ("any-batch",)


def test_an_approximate_instruction_op_takes_any_x86_cpu():
    coverage = _coverage.of(_default_profile(), {"Rsqrt"})
    assert coverage.lost == ("any-x86-cpu",)
    assert "Rsqrt (its bits may follow the CPU model)" in coverage.describe()


def test_a_profile_that_promises_nothing_loses_nothing():
    ran = {"MatMul", "Rsqrt"}
    assert _coverage.of(_default_profile(op_determinism=False), ran).lost == ()
    assert _coverage.of(_default_profile(), ran, device="gpu").lost == ()
    # Without the pool-size-free products no thread tier was promised.
    old = _default_profile(intra_op_threads=1, patches=["auto"])
    assert _coverage.of(old, ran).lost == ("any-x86-cpu",)


def test_the_record_reads_back_from_json():
    coverage = _coverage.of(_default_profile(), {"MatMul"}, [("MatMul", "float16")])
    again = _coverage.Coverage.from_dict(json.loads(json.dumps(coverage.to_dict())))
    assert again == coverage


# --- Measured in fresh processes, against the bits ---------------------------

# A product at several shapes, traced in a function of one's own (no Keras):
# the coverage is then said at exit.
_PRODUCTS = """
import hashlib, json, sys
import tfdet
profile = tfdet.enable(threads=int(sys.argv[1]))
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(0)
dtype = getattr(tf, sys.argv[2])
digests = []
for m, k, n in [(64, 4096, 256), (256, 8192, 64)]:
    a = tf.constant(rng.standard_normal((m, k)), dtype)
    b = tf.constant(rng.standard_normal((k, n)), dtype)
    product = tf.function(lambda a, b: tf.matmul(a, b))(a, b)
    digests.append(hashlib.sha256(product.numpy().tobytes()).hexdigest()[:16])
coverage = tfdet.coverage()
print(json.dumps({"digests": digests, "coverage": coverage.to_dict(),
                  "tiers": list(profile.tiers(coverage=coverage))}))
"""


def _products(threads: int, dtype: str) -> tuple[dict, str]:
    code = f"import sys; sys.argv = ['run', '{threads}', '{dtype}']\n" + _PRODUCTS
    result = run_python(code, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.slow
def test_the_coverage_names_what_follows_the_pool_and_the_bits_agree():
    float32 = {threads: _products(threads, "float32") for threads in (1, 2)}
    bfloat16 = {threads: _products(threads, "bfloat16") for threads in (1, 2)}
    # float32: the kernels take the products; nothing is said, one digest.
    for found, stderr in float32.values():
        assert found["coverage"]["uncovered"] == []
        assert found["tiers"] == list(ALL_CPU_TIERS)
        assert "not covered by tfdet" not in stderr
    assert float32[1][0]["digests"] == float32[2][0]["digests"]
    # bfloat16: TensorFlow's MatMul; the coverage says it follows the pool,
    # and it does (the control: the same perturbation, other bits).
    found, stderr = bfloat16[2]
    assert [op["op"] for op in found["coverage"]["uncovered"]] == ["MatMul"]
    assert found["tiers"] == ["this-machine"]
    assert bfloat16[1][0]["tiers"] == [
        "this-machine",
        "any-thread-count",
        "any-x86-cpu",
    ]
    assert bfloat16[1][0]["digests"] != bfloat16[2][0]["digests"]
    # enable()'s log (at exit: no Keras step here) says the same, once.
    assert stderr.count("not covered by tfdet: MatMul on bfloat16") == 1
    assert "tiers lost: any thread count, any x86 CPU, any batch" in stderr


_KERAS_FIT = """
import sys
import tfdet
tfdet.enable()
import keras
import numpy as np
keras.mixed_precision.set_global_policy(sys.argv[1])
rng = np.random.default_rng(0)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8), keras.layers.Dense(3)])
model.compile("sgd", "mse")
model.fit(rng.standard_normal((8, 16)), rng.standard_normal((8, 3)), epochs=2, verbose=0)
print("fit returned", flush=True)
"""


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_enable_logs_the_coverage_after_the_first_keras_step(policy):
    code = f"import sys; sys.argv = ['run', '{policy}']\n" + _KERAS_FIT
    result = run_python(code, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stderr.count("not covered by tfdet")
    if policy == "float32":
        assert said == 0
    else:
        # Once, at the first step, not again at exit.
        assert said == 1
        assert "MatMul on bfloat16" in result.stderr


_TARGET = """
def dense(policy="float32"):
    import keras
    import numpy as np

    keras.mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16),
                              keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    return model, rng.standard_normal((64, 32)), rng.standard_normal((64, 4))


def bfloat16_dense():
    return dense("mixed_bfloat16")
"""


@pytest.mark.slow
def test_check_reports_the_ops_the_default_does_not_cover(tmp_path):
    (tmp_path / "models.py").write_text(_TARGET)
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", f"{tmp_path / 'models.py'}:bfloat16_dense", "--perturb", "hashseed",
        "--steps", "2", "--json", str(report_path),
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "not covered by tfdet: " in proc.stdout
    assert "MatMul on bfloat16" in proc.stdout
    runs = json.loads(report_path.read_text())["devices"]["cpu"]["runs"]
    lost = {tuple(run["coverage"]["lost"]) for run in runs}
    assert lost == {("any-thread-count", "any-x86-cpu", "any-batch")}


def test_a_checks_runs_merge_into_what_any_of_them_left():
    left = [("MatMul", "bfloat16")]
    two_threads = _coverage.of(_default_profile(), {"MatMul"}, left)
    one_thread = _coverage.of(_default_profile(intra_op_threads=1), {"MatMul"}, left)
    merged = _coverage.Coverage.merged([one_thread, two_threads])
    assert merged == two_threads
    assert _coverage.Coverage.merged([]) == _coverage.Coverage()
