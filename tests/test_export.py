"""A model trained under the default and exported serves without tfdet.

The default computes products and convolutions with tfdet's own ops; a
SavedModel that held them would load only where tfdet's library does. Each
step runs in a fresh process: the training one (`tfdet.enable()`, a fit,
`model.export` and `model.save(".keras")`), a server without tfdet, and a
server under `tfdet.enable()` loading the `.keras` file.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_json

pytestmark = pytest.mark.slow

_TRAIN = """
import hashlib, json, sys
import numpy as np
import tfdet
tfdet.enable(seed=0, patches=json.loads(sys.argv[2]))
import keras
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.standard_normal((32, 12, 6)).astype("float32")
y = rng.standard_normal((32, 1)).astype("float32")
inputs = keras.Input((12, 6))
h = keras.layers.Conv1D(8, 3, activation="gelu")(inputs)
h = keras.layers.GlobalAveragePooling1D()(h)
outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(h))
model = keras.Model(inputs, outputs)
model.compile("adam", "mse")
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
graph = tf.function(model).get_concrete_function(tf.TensorSpec((None, 12, 6))).graph
model.export(sys.argv[1] + "/saved")
model.save(sys.argv[1] + "/model.keras")
np.save(sys.argv[1] + "/x.npy", x)
predictions = np.asarray(model(x))
np.save(sys.argv[1] + "/predictions.npy", predictions)
print(json.dumps({
    "kernels": sorted({op.type for op in graph.get_operations() if "Tfdet" in op.type}),
    "profile_kernels": list(tfdet.profile().kernels or ()),
}))
"""

_SERVE_WITHOUT_TFDET = """
import json, sys
import numpy as np
import tensorflow as tf

x = np.load(sys.argv[1] + "/x.npy")
try:
    loaded = tf.saved_model.load(sys.argv[1] + "/saved")  # Kept: owns the variables.
except Exception as error:  # The control: tfdet's ops are not registered here.
    print(json.dumps({"error": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
served = np.asarray(loaded.serve(x))
trained = np.load(sys.argv[1] + "/predictions.npy")
print(json.dumps({
    "tfdet": "tfdet" in sys.modules,
    "close": bool(np.allclose(served, trained, rtol=1e-4, atol=1e-5)),
    "same_bits": bool((served.view(np.uint32) == trained.view(np.uint32)).all()),
}))
"""

_SERVE_WITH_TFDET = """
import json, sys
import numpy as np
import tfdet
tfdet.enable(seed=0)
import keras

model = keras.models.load_model(sys.argv[1] + "/model.keras")
served = np.asarray(model(np.load(sys.argv[1] + "/x.npy")))
trained = np.load(sys.argv[1] + "/predictions.npy")
print(json.dumps({
    "same_bits": bool((served.view(np.uint32) == trained.view(np.uint32)).all()),
}))
"""


def _train(directory, patches) -> dict:
    directory.mkdir()
    return run_json(_TRAIN, str(directory), json.dumps(patches))


def test_an_export_under_the_default_serves_without_tfdet_and_a_keras_file_with_it(
    tmp_path,
):
    trained = _train(tmp_path / "default", ["auto"])
    # The training ran tfdet's kernels (else the test proves nothing).
    assert "fixed_order_products" in trained["profile_kernels"], trained
    assert trained["kernels"], trained
    served = run_json(_SERVE_WITHOUT_TFDET, str(tmp_path / "default"))
    assert served.get("error") is None, served
    assert served["tfdet"] is False and served["close"], served
    # With tfdet: the .keras file (weights and configuration, no ops) runs
    # the kernels again, with the training process's bits.
    again = run_json(_SERVE_WITH_TFDET, str(tmp_path / "default"))
    assert again["same_bits"], again


def test_the_control_an_export_with_the_kernels_does_not_load_without_tfdet(tmp_path):
    trained = _train(tmp_path / "kernels", ["auto", "-export_without_kernels"])
    assert trained["kernels"], trained
    served = run_json(_SERVE_WITHOUT_TFDET, str(tmp_path / "kernels"))
    assert "Tfdet" in served.get("error", ""), served
