"""The default `tfdet.enable()`: every core, tfdet's kernels, and where they
cannot run (a function XLA compiles) the compositions, in fresh processes."""

from __future__ import annotations

import pytest

from tests.conftest import run_json

_XLA = """
import json, sys
import numpy as np
import tfdet
tfdet.enable(seed=0)
import keras
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.standard_normal((32, 6, 6, 3)).astype("float32")
y = rng.integers(0, 3, 32)
model = keras.Sequential([
    keras.Input((6, 6, 3)),
    keras.layers.Conv2D(4, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(3),
])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=sys.argv[1] == "xla")
history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
step = tf.function(model, jit_compile=sys.argv[1] == "xla")
graph = step.get_concrete_function(tf.TensorSpec((None, 6, 6, 3))).graph
print(json.dumps({
    "loss": float(history.history["loss"][-1]),
    "kernels": sorted({op.type for op in graph.get_operations() if "Tfdet" in op.type}),
    "loaded": list(tfdet.profile().kernels or ()),
}))
"""


@pytest.mark.slow
def test_a_model_compiled_by_xla_trains_with_the_compositions() -> None:
    # XLA compiles TensorFlow's ops, not custom ones: under jit_compile=True
    # the products and convolutions are traced as compositions. Before,
    # the fit failed ("tf2xla conversion failed" at the kernel's MatMul).
    compiled = run_json(_XLA, "xla")
    assert compiled["kernels"] == [], compiled
    assert compiled["loss"] == compiled["loss"], compiled  # Not NaN.
    # The control: the same model without XLA runs the kernels.
    plain = run_json(_XLA, "graph")
    assert "fixed_order_products" in plain["loaded"], plain
    assert plain["kernels"], plain


_BROADCAST = """
import json, resource
import numpy as np
import tfdet
tfdet.enable(seed=0)
import tensorflow as tf

rng = np.random.default_rng(0)
w = tf.constant(rng.standard_normal((256, 1024)), tf.float32)
# The same bits whether B is one matrix read by every product (packed once)
# or a batch of copies (packed one by one).
x = tf.constant(rng.standard_normal((50, 4, 256)), tf.float32)
shared = tf.matmul(x, w).numpy()
copies = tf.matmul(x, tf.broadcast_to(w, [50, 256, 1024])).numpy()
big = tf.constant(rng.standard_normal((2000, 4, 256)), tf.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tf.matmul(big, w).numpy()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "same_bits": bool((shared.view(np.uint32) == copies.view(np.uint32)).all()),
    "extra_mib": (after - before) / 1024,
    "kernels": list(tfdet.profile().kernels or ()),
}))
"""


@pytest.mark.slow
def test_a_broadcast_operand_is_packed_once() -> None:
    # tf.matmul of (2000, 4, 256) by one (256, 1024) weight: the kernel
    # packed the weight once per product, 2000 copies (2 GiB more than
    # TensorFlow's own op, and 15x its time; 2-core Xeon Emerald Rapids);
    # now once. The output is 31 MiB.
    found = run_json(_BROADCAST)
    assert "fixed_order_products" in found["kernels"], found
    assert found["same_bits"], found
    assert found["extra_mib"] < 400, found
