"""`portable_kernels`: the portable Erfc as one op, with the composition's bits.

The kernel must give, element for element, the bits of
`portable_erfc.erfc_float32` (the composition of TensorFlow ops that the
default profile uses): on every kind of float32, every tensor length (the
last `length % 8` elements take Eigen's scalar Exp), eagerly and in a graph,
with the gradient unchanged, and in a trained model's weights. The control:
TensorFlow's own Erfc gives other bits than the composition on the same
inputs, so the comparison can tell two implementations apart.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tests.conftest import ERFC_FOLLOWS_THE_CPU, run_json
from tfdet._kernels import library as kernel_library
from tfdet.patches import portable_erfc, portable_kernels


@pytest.fixture(scope="module")
def library():
    """The loaded library, built once (conftest's shared kernel cache)."""
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: the kernel cannot be built")
    loaded = portable_kernels.LIBRARY.load()
    assert loaded is not None
    return loaded


def _bits(tensor) -> np.ndarray:
    return np.asarray(tensor).view(np.uint32)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 4099, 1_000_003])
def test_the_kernel_gives_the_compositions_bits_at_every_length(library, length):
    import tensorflow as tf

    rng = np.random.default_rng(length)
    x = tf.constant((3 * rng.standard_normal(length)).astype(np.float32))
    expected = _bits(portable_erfc.erfc_float32(x))
    assert np.array_equal(_bits(library.tfdet_portable_erfc(x)), expected)
    both = tf.function(lambda v: library.tfdet_portable_erfc(v))
    assert np.array_equal(_bits(both(x)), expected)


def test_on_every_kind_of_float32_and_only_tensorflows_own_erfc_differs(library):
    import tensorflow as tf

    x = tf.constant(portable_kernels.probe_inputs().reshape(4, -1))
    expected = _bits(portable_erfc.erfc_float32(x))
    assert np.array_equal(_bits(library.tfdet_portable_erfc(x)), expected)
    # The control: TensorFlow's kernel (its reciprocal is RCPPS's estimate)
    # gives other bits on some of the same inputs.
    original = portable_erfc._ERFC.original or tf.raw_ops.Erfc
    own = _bits(original(x=x) if original is tf.raw_ops.Erfc else original(x))
    assert not np.array_equal(own, expected)


def test_erfc_and_its_gradient_are_the_compositions_with_the_kernel_in_place(
    library, monkeypatch
):
    import tensorflow as tf

    x = tf.constant(np.linspace(-4, 4, 1001, dtype=np.float32))
    found = []
    for kernel in (None, portable_kernels.erfc):
        monkeypatch.setattr(portable_erfc, "kernel", kernel)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = portable_erfc.erfc(x)
        found.append((_bits(y), _bits(tape.gradient(y, x))))
    assert all(np.array_equal(a, b) for a, b in zip(*found, strict=True))


def test_a_kernel_that_disagrees_is_not_used_and_says_so_once(
    library, monkeypatch, caplog
):
    import tensorflow as tf

    class Wrong:
        @staticmethod
        def tfdet_portable_erfc(x, whole_packets=False):
            return tf.zeros_like(x)

    monkeypatch.setattr(portable_kernels.LIBRARY, "_state", {"library": Wrong()})
    monkeypatch.setattr(portable_kernels, "_verdict", {})
    x = tf.constant([0.5, 2.0], tf.float32)
    with caplog.at_level(logging.WARNING, logger="tfdet"):
        first = portable_kernels.erfc(x)
        second = portable_kernels.erfc(x)
    expected = _bits(portable_erfc.erfc_float32(x))
    assert np.array_equal(_bits(first), expected)
    assert np.array_equal(_bits(second), expected)
    assert [r.message for r in caplog.records].count(
        "tfdet: the portable_kernels Erfc kernel gave other bits than the "
        "composition on its probe inputs; the composition is used."
    ) == 1


# The exact GELU as TensorFlow 2.19+ writes it (before, tf.nn.gelu used Erf),
# so that the model reaches Erfc on every TensorFlow.
_GELU = "lambda v: 0.5 * v * tf.math.erfc(-v * 0.7071067811865476)"

_TRAIN = """
import json, sys
import tfdet
patches = json.loads(sys.argv[1])
profile = tfdet.enable(**({"patches": patches} if patches else {}))
import hashlib
import keras
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 33)).astype("float32")
y = rng.integers(0, 3, 64)
model = keras.Sequential([
    keras.Input((33,)),
    keras.layers.Dense(67, activation=GELU),
    keras.layers.Dense(3),
])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
graph = tf.function(model).get_concrete_function(tf.TensorSpec((None, 33))).graph
ops = {op.type for op in graph.get_operations()}
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights()))
print(json.dumps({"digest": digest.hexdigest()[:16],
                  "kernel": "TfdetPortableErfc" in ops,
                  "kernels": list(profile.kernels or ())}))
""".replace("GELU", _GELU)


@pytest.mark.slow
def test_training_with_the_kernel_gives_the_default_profiles_weights(library):
    # The composition: the default less this patch.
    composed = run_json(_TRAIN, json.dumps(["auto", "-portable_kernels"]))
    with_kernel = run_json(_TRAIN, json.dumps([]))  # The default.
    # Where TensorFlow's own Erfc is portable (before 2.20), enable() keeps
    # it, and the kernel has no composition to stand for.
    assert with_kernel["kernel"] == ERFC_FOLLOWS_THE_CPU and not composed["kernel"]
    # The profile names the library where an op uses it, and only there.
    assert ("portable_kernels" in with_kernel["kernels"]) == ERFC_FOLLOWS_THE_CPU
    assert "portable_kernels" not in composed["kernels"]
    assert with_kernel["digest"] == composed["digest"]


_EXPORT = """
import hashlib, json, sys
import tfdet
tfdet.enable(patches=["auto", "portable_kernels"])
import keras
import numpy as np
import tensorflow as tf

x = np.random.default_rng(0).standard_normal((5, 8)).astype("float32")
model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(16, activation=GELU),
    keras.layers.Dense(2),
])
graph = tf.function(model).get_concrete_function(tf.TensorSpec((None, 8))).graph
model.export(sys.argv[1])
print(json.dumps({
    "kernel": "TfdetPortableErfc" in {op.type for op in graph.get_operations()},
    "y": hashlib.sha256(np.asarray(model(x)).tobytes()).hexdigest(),
}))
""".replace("GELU", _GELU)

_SERVE = """
import hashlib, json, sys
import numpy as np
import tensorflow as tf

x = np.random.default_rng(0).standard_normal((5, 8)).astype("float32")
if len(sys.argv) > 2:  # a Grappler pass turned off, as tfdet's process has it
    tf.config.optimizer.set_experimental_options({sys.argv[2]: False})
loaded = tf.saved_model.load(sys.argv[1])  # Kept: it owns the variables.
served = loaded.serve(x)
print(json.dumps({"y": hashlib.sha256(np.asarray(served).tobytes()).hexdigest()}))
"""


@pytest.mark.slow
def test_an_exported_model_loads_and_serves_the_same_bits_without_tfdet(
    library, tmp_path
):
    # Exported while the kernel runs the model's steps, the SavedModel holds
    # the composition (before, loading it without tfdet failed: "Op type not
    # registered 'TfdetPortableErfc'"), and serves the kernel's bits.
    exported = run_json(_EXPORT, str(tmp_path / "model"))
    # It never imports tfdet. What decides the Dense layers' products is set
    # as tfdet's profile sets it (oneDNN on, its AVX2 cap, one thread), so the
    # comparison is the GELU's: under TensorFlow's defaults on an AVX-512 CPU
    # (an AMD EPYC Zen 5) oneDNN's AVX-512 products gave other bits.
    profile_env = {
        "TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
    }  # fmt: skip
    assert exported["kernel"] == ERFC_FOLLOWS_THE_CPU
    if ERFC_FOLLOWS_THE_CPU:
        served = run_json(_SERVE, str(tmp_path / "model"), **profile_env)
        assert served["y"] == exported["y"]
        return
    # Before 2.20 the SavedModel holds TensorFlow's own Erfc, and a server's
    # Grappler, its arithmetic optimizer on, lets the remapper fuse the Dense
    # layer's product and this GELU into oneDNN's fused op (TF 2.19.1: other
    # bits). tfdet's processes keep that optimizer off (portable_sqrt_division),
    # and so must the server.
    served = run_json(
        _SERVE, str(tmp_path / "model"), "arithmetic_optimization", **profile_env
    )
    assert served["y"] == exported["y"]


_BATCHES = """
import hashlib, json, sys
import numpy as np
import tfdet
tfdet.enable(threads=2, patches=json.loads(sys.argv[1]))
import tensorflow as tf

x = tf.constant(np.random.default_rng(0).normal(size=(96, 1023)) * 3, tf.float32)
gelu = tf.function(lambda v: 0.5 * v * tf.math.erfc(-v * 0.7071067811865476))
graph = gelu.get_concrete_function(tf.TensorSpec([None, 1023])).graph
whole = gelu(x).numpy()
print(json.dumps({
    "kernel": "TfdetPortableErfc" in {op.type for op in graph.get_operations()},
    "rows": {b: int(np.any(gelu(x[:b]).numpy() != whole[:b], 1).sum())
             for b in (1, 5, 7, 32)},
    "y": hashlib.sha256(whole.tobytes()).hexdigest(),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not ERFC_FOLLOWS_THE_CPU, reason="portable_kernels does nothing before TF 2.20"
)
def test_with_pool_size_free_products_the_gelu_keeps_its_bits_in_any_batch(library):
    """The kernel's exp, like TensorFlow's Exp, takes the scalar path for a
    tensor's last `size % 8` elements, so its bits follow the batch; under
    `pool_size_free_products` (whose promise is any batch) or `portable_math`
    it runs on whole packets, as the composition's Exp does there, and the
    kernel is kept."""
    kept = run_json(_BATCHES, json.dumps(["auto"]))  # The default has both.
    assert kept["kernel"] is True
    assert set(kept["rows"].values()) == {0}, kept
    # The same bits as the composition under the same patches.
    composed = run_json(_BATCHES, json.dumps(["auto", "-portable_kernels"]))
    assert composed["kernel"] is False
    assert kept["y"] == composed["y"], (kept, composed)
    # Either patch alone puts the exp on whole packets.
    for left_out in ("pool_size_free_products", "portable_math"):
        one = run_json(_BATCHES, json.dumps(["auto", f"-{left_out}"]))
        assert one["kernel"] is True
        assert set(one["rows"].values()) == {0}, (left_out, one)
    # The control: the kernel without both (its exp's scalar tail) gives a
    # row of a batch of 5 other bits.
    alone = run_json(
        _BATCHES,
        json.dumps(["auto", "-pool_size_free_products", "-portable_math"]),
    )
    assert alone["kernel"] is True
    assert any(alone["rows"].values()), alone
