"""`fixed_order_products` and `fixed_order_convolutions`: a Conv1D +
MultiHeadAttention + Dense model's training bits do not follow the pool
size, its products and convolution computed by tfdet's kernel, alone and
beside `pool_size_free_products`.

A fresh process per pool size (1, 2) trains the model twice: under the
default profile (the control) and with the patch installed. The patched
graph holds the kernel's ops and none of TensorFlow's products or convolutions.

The control's products are oneDNN's sgemm, which splits a long sum over the
pool's threads only where its operand outgrows the core's cache: on an AMD
EPYC (1 MiB L2) the model's 32x4096 @ 4096x64 product already follows the
pool, on an Intel Xeon (Sapphire Rapids, 2 MiB L2) it ran as one chain at
pools 1-4 and the model's weights were the same at pools 1 and 2. So the
model also has a 32768-wide input: its 32x32768 @ 32768x16 product followed
the pool on both (pool 1 vs 2: other weights on each CPU).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import TENSORFLOW_PRODUCTS, clean_env, last_json_line, run_python
from tfdet._kernels import library as kernel_library

TRAIN = """
import hashlib, json, sys
import numpy as np
import tfdet
# TensorFlow's own products first (the control), then the patches.
tfdet.enable(seed=0, threads=int(sys.argv[1]), patches=sys.argv[2].split(","))
import keras
import tensorflow as tf
from tfdet._patching import _registry

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8, 512)).astype("float32")
wide = rng.normal(size=(64, 32768)).astype("float32")
y = rng.integers(0, 4, size=(64,))

def model_and_digest():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 512))
    wide_input = keras.Input((32768,))
    h = keras.layers.MultiHeadAttention(2, 16)(inputs, inputs)
    h = keras.layers.Concatenate()(
        [h, keras.layers.Conv1D(16, 3, padding="same")(inputs)])
    h = keras.layers.Concatenate()(
        [keras.layers.Flatten()(h), keras.layers.Dense(16)(wide_input)])
    h = keras.layers.Dense(64, activation="relu")(h)
    model = keras.Model([inputs, wide_input], keras.layers.Dense(4)(h))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    for step in range(2):
        batch = slice(32 * step, 32 * step + 32)
        model.train_on_batch([x[batch], wide[batch]], y[batch])
    sha = hashlib.sha256()
    for weight in model.get_weights():
        sha.update(np.ascontiguousarray(weight).tobytes())
    return model, sha.hexdigest()[:16]

_, plain = model_and_digest()
_registry.install(["fixed_order_products", "fixed_order_convolutions"])
model, patched = model_and_digest()
graph = tf.function(model).get_concrete_function(
    [tf.TensorSpec([None, 8, 512], tf.float32),
     tf.TensorSpec([None, 32768], tf.float32)]).graph
ops = sorted({op.type for op in graph.get_operations()})
# With pool_size_free_products too: the products stay the kernel's.
_registry.install(["pool_size_free_products"])
model, both = model_and_digest()
graph = tf.function(model).get_concrete_function(
    [tf.TensorSpec([None, 8, 512], tf.float32),
     tf.TensorSpec([None, 32768], tf.float32)]).graph
both_ops = sorted({op.type for op in graph.get_operations()})
print(json.dumps({"plain": plain, "patched": patched, "ops": ops, "both": both,
                  "both_ops": both_ops}))
"""


@pytest.mark.slow
def test_training_bits_do_not_follow_the_pool_size_only_with_the_patch():
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: the patch falls back to the composition")
    processes = {
        threads: subprocess.Popen(
            [sys.executable, "-c", TRAIN, str(threads), TENSORFLOW_PRODUCTS],
            env=clean_env(),  # the suite's shared kernel build
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
    assert results[1]["patched"] == results[2]["patched"], results
    # The control: without the patch, pools 1 and 2 give other weights.
    assert results[1]["plain"] != results[2]["plain"], results
    ops = set(results[1]["ops"])
    kernel_ops = {
        "TfdetFixedOrderMatMul",
        "TfdetFixedOrderBatchMatMul",
        "TfdetFixedOrderConv2D",
    }
    assert kernel_ops <= ops, ops
    assert not ops & {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"}, ops
    assert not ops & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, ops
    # Together with pool_size_free_products: its convolutions do not take
    # the products back, and the bits still do not follow the pool size.
    both = set(results[1]["both_ops"])
    assert kernel_ops <= both, both
    assert "Conv2D" not in both, both
    assert results[1]["both"] == results[2]["both"], results


_OTHER_DTYPE = """
import json
import numpy as np
import tfdet
tfdet.enable(patches=["auto", "fixed_order_convolutions"])
import tensorflow as tf

x = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 6, 3)), tf.float64)
same = {}
for name, conv, w in (
    ("conv2d", lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), tf.ones((3, 3, 3, 4), tf.float64)),
    ("depthwise", lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME"),
     tf.ones((3, 3, 3, 1), tf.float64)),
):
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = conv(x, w)
    same[name] = [g.dtype.name for g in tape.gradient(y, [x, w])]
print(json.dumps(same))
"""


def test_what_neither_kernel_nor_composition_takes_goes_to_tensorflow():
    # float64, with the kernels' patch alone: its fallback, the pool-size-free
    # products' composition, leaves it to TensorFlow's op although its own
    # patch is not installed (before, the convolution's gradients raised
    # "'NoneType' object is not callable").
    result = run_python(_OTHER_DTYPE, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_json_line(result.stdout) == {
        "conv2d": ["float64", "float64"],
        "depthwise": ["float64", "float64"],
    }
