"""tfdet's fixed-order product kernel: bits fixed by the shapes alone.

Its values agree with `tf.matmul` to float32 rounding (forward and both
gradients, every transpose, broadcast batches); its bits do not follow the
row count (a row computed in a batch of 96 equals the row computed alone),
the micro-kernel's vector width (AVX2 and scalar paths), nor the pool size
(fresh processes with pools 1, 2, 3, 4). Each invariance has its control:
TensorFlow's own product under the same perturbation gives other bits.
The kernel is built once for the suite (`TFDET_KERNEL_CACHE`, set by
tests/conftest.py, shared by pytest-xdist's workers and the processes they
start).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import clean_env, last_json_line
from tfdet.patches import _fixed_order_kernels, _kernel_library


@pytest.fixture(scope="session")
def kernels():
    """The loaded kernel module, built once (conftest's shared cache)."""
    if _kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: the kernel cannot be built")
    assert _fixed_order_kernels.load() is not None
    return _fixed_order_kernels


def _bits(tensor) -> bytes:
    return np.ascontiguousarray(np.asarray(tensor)).tobytes()


# (m, k, n): one micro-tile, edges in every direction, K over one K block.
SHAPES = ((1, 1, 1), (7, 13, 17), (6, 16, 16), (97, 300, 50), (32, 1000, 70))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_values_and_gradients_match_tf_matmul(kernels, shape, transpose_a, transpose_b):
    import tensorflow as tf

    m, k, n = shape
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(k, m) if transpose_a else (m, k)), tf.float32)
    b = tf.constant(rng.normal(size=(n, k) if transpose_b else (k, n)), tf.float32)
    upstream = tf.constant(rng.normal(size=(m, n)), tf.float32)
    found = []
    for product in (kernels.matmul, tf.matmul):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            c = product(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        found.append([c, *tape.gradient(c, [a, b], output_gradients=upstream)])
    # Float32 rounding of sums of K (or m, n) terms, relative to the largest.
    for ours, theirs in zip(*found, strict=True):
        scale = max(float(np.abs(theirs).max()), 1e-30)
        terms = max(m, k, n)
        assert np.abs(ours - theirs).max() / scale < 1e-5 * np.sqrt(terms)


def test_batched_products_broadcast_like_tensorflow(kernels):
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(4, 1, 5, 7)), tf.float32)
    y = tf.constant(rng.normal(size=(3, 6, 7)), tf.float32)
    upstream = tf.constant(rng.normal(size=(4, 3, 5, 6)), tf.float32)
    found = []
    for product in (
        lambda x, y: kernels.batch_matmul(x, y, adj_y=True),
        lambda x, y: tf.matmul(x, y, adjoint_b=True),
    ):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            c = product(x, y)
        found.append([c, *tape.gradient(c, [x, y], output_gradients=upstream)])
    for ours, theirs in zip(*found, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_empty_dimensions_give_tensorflows_shapes(kernels):
    import tensorflow as tf

    assert kernels.matmul(tf.zeros([0, 3]), tf.zeros([3, 4])).shape == (0, 4)
    # No terms to sum: zeros, as TensorFlow gives.
    assert not np.any(kernels.matmul(tf.ones([3, 0]), tf.ones([0, 4])))


def test_rows_do_not_follow_the_batch(kernels):
    """Row r of a product of 96 rows equals row r computed in 1, 5 or 32."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(96, 512)), tf.float32)
    w = tf.constant(rng.normal(size=(512, 256)), tf.float32)
    whole = kernels.matmul(x, w).numpy()
    for rows in (1, 5, 32):
        part = kernels.matmul(x[:rows], w).numpy()
        assert _bits(part) == _bits(whole[:rows]), rows


def test_scalar_path_gives_the_avx2_paths_bits(kernels, monkeypatch):
    import tensorflow as tf

    rng = np.random.default_rng(3)
    a = tf.constant(rng.normal(size=(50, 700)), tf.float32)
    b = tf.constant(rng.normal(size=(700, 40)), tf.float32)
    x = tf.constant(rng.normal(size=(3, 9, 20)), tf.float32)
    y = tf.constant(rng.normal(size=(3, 20, 18)), tf.float32)

    def results():
        return [
            kernels.matmul(a, b),
            kernels.matmul(b, a, transpose_a=True, transpose_b=True),
            kernels.batch_matmul(x, y),
        ]

    default = results()
    monkeypatch.setenv(_fixed_order_kernels.ISA_VARIABLE, "scalar")
    scalar = results()
    assert [_bits(r) for r in default] == [_bits(r) for r in scalar]


def test_a_missing_compiler_is_said_once_and_load_gives_none(monkeypatch, caplog):
    monkeypatch.setattr(_kernel_library, "compiler", lambda: None)
    monkeypatch.setattr(_fixed_order_kernels.LIBRARY, "_loaded", {})
    with caplog.at_level("WARNING", logger="tfdet"):
        assert _fixed_order_kernels.load() is None
        assert _fixed_order_kernels.load() is None
    warnings = [r for r in caplog.records if "_fixed_order_matmul.cc" in r.getMessage()]
    assert len(warnings) == 1
    assert "no C++ compiler" in warnings[0].getMessage()
    assert "products use the slower pool-size-free composition instead" in (
        warnings[0].getMessage()
    )


# One process per setting (pool size, oneDNN ISA cap): the kernel's and
# tf.matmul's bits on the same inputs, forward and both gradients, and the
# rows of a 96-row product computed in batches of 1, 5 and 32.
PRODUCTS = """
import hashlib, json, sys
import numpy as np
import tfdet
tfdet.enable(seed=0, threads=int(sys.argv[1]), cpu_isa=sys.argv[2])
import tensorflow as tf
from tfdet.patches import _fixed_order_kernels as kernels

def digest(tensors):
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(np.ascontiguousarray(tensor).tobytes())
    return sha.hexdigest()[:16]

rng = np.random.default_rng(0)
a = tf.constant(rng.normal(size=(32, 4096)), tf.float32)
b = tf.constant(rng.normal(size=(4096, 64)), tf.float32)
upstream = tf.constant(rng.normal(size=(32, 64)), tf.float32)
x = tf.constant(rng.normal(size=(96, 256)), tf.float32)
w = tf.constant(rng.normal(size=(256, 64)), tf.float32)
found = {}
for name, product in (("kernel", kernels.matmul), ("tf", tf.matmul)):
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        c = product(a, b)
    pool = digest([c, *tape.gradient(c, [a, b], output_gradients=upstream)])
    whole = product(x, w).numpy()
    rows = {
        batch: int(np.sum(np.any(product(x[:batch], w).numpy() != whole[:batch], 1)))
        for batch in (1, 5, 32)
    }
    found[name] = {"pool": pool, "rows": rows}
print(json.dumps(found))
"""

# (threads, oneDNN ISA cap): the pool sizes under enable()'s AVX2 cap, and
# one pool under SSE4.1 (oneDNN's narrower vectors, the control for width).
SETTINGS = ((1, "AVX2"), (2, "AVX2"), (3, "AVX2"), (4, "AVX2"), (1, "SSE41"))


@pytest.mark.slow
def test_bits_follow_neither_pool_nor_batch_where_tf_matmuls_do(kernels):
    processes = {
        setting: subprocess.Popen(
            [sys.executable, "-c", PRODUCTS, str(setting[0]), setting[1]],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for setting in SETTINGS
    }
    results = {}
    for setting, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[setting] = last_json_line(out)
    kernel = {s: r["kernel"]["pool"] for s, r in results.items()}
    tf_matmul = {s: r["tf"]["pool"] for s, r in results.items()}
    # One digest for every pool size and both ISA caps.
    assert len(set(kernel.values())) == 1, kernel
    # The controls: TensorFlow's product follows the pool size, and the cap.
    pools = [tf_matmul[(threads, "AVX2")] for threads in (1, 2, 3, 4)]
    assert len(set(pools)) > 1, tf_matmul
    assert tf_matmul[(1, "SSE41")] != tf_matmul[(1, "AVX2")], tf_matmul
    for setting, result in results.items():
        assert set(result["kernel"]["rows"].values()) == {0}, (setting, result)
    # Control: some row of TensorFlow's product follows its batch.
    assert any(sum(result["tf"]["rows"].values()) for result in results.values()), (
        results
    )
