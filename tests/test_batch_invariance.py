"""Batch invariance: a sample's output bits whatever else is in its batch.

Under the default `tfdet.enable()` (tfdet's kernels and the pool-size-free
compositions), each of five small models (an
MLP with GELU; Conv2D + BatchNormalization + MaxPooling; MultiHeadAttention +
LayerNormalization; LSTM; Embedding + pooling) and each of the op survey's
29 models predicts every input with the bits it gets in one whole batch,
when predicted in another order in batches of 1, 5 or 32, or eagerly as
`model(x[i:i + 5])`. The control, on the five: with TensorFlow's own
products (`enable(threads=1, patches=None)`) the same predictions differ
(oneDNN's sgemm and its batch-of-one convolution kernel, the scalar tails of
element-wise functions). A model exported under the default holds
TensorFlow's ops only and keeps the property where it is served without
tfdet.

Each setting runs in a fresh process (`benchmarks/batch_invariance.py`, the
measurement the docs quote).
"""

from __future__ import annotations

import concurrent.futures
import sys

import pytest

from tests.conftest import REPO, clean_env, last_json_line, run_python

sys.path.insert(0, str(REPO / "benchmarks"))
import batch_invariance  # noqa: E402

pytestmark = pytest.mark.slow

BATCHES = ["1", "5", "32", "call"]
SURVEY = [str(REPO / "benchmarks")]


@pytest.fixture(scope="module", params=["five", "survey"])
def counts(request) -> tuple[str, dict[str, dict]]:
    """One set of models (the five, or the survey's 29) and, per setting, the
    rows that differ: the two settings in two processes side by side. One
    set per fixture instance, so that selecting one test (the smoke set
    takes the five) measures only its set."""
    models = request.param
    arguments = SURVEY if models == "survey" else []
    # The control runs on the five: on the survey's 29 it doubled the
    # suite's slowest fixture (its figures: benchmarks/batch_invariance.py).
    settings = ["enable"]
    if models == "five":
        settings.append("tensorflow_ops")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            setting: pool.submit(
                batch_invariance.measure,
                setting,
                batch_invariance.MODELS_CHILD,
                BATCHES,
                *arguments,
            )
            for setting in settings
        }
        return models, {key: future.result() for key, future in futures.items()}


def test_each_sample_keeps_its_bits_in_any_batch_only_under_tfdet_s_products(counts):
    models, measured = counts
    patched = measured["enable"]
    nonzero = {
        name: by_batch for name, by_batch in patched.items() if any(by_batch.values())
    }
    assert nonzero == {}
    assert len(patched) == (5 if models == "five" else 29)
    # The control: with TensorFlow's own products a sample's bits follow its
    # batch, on every one of the five models (and on most of the survey's:
    # all but mixed_bfloat16 and the tf.data model's Dense head on an AMD
    # EPYC Zen 4, measured by the benchmark).
    if models == "five":
        default = measured["tensorflow_ops"]
        following = [n for n, by_batch in default.items() if any(by_batch.values())]
        assert sorted(following) == sorted(default)


EXPORT = """
import sys
import numpy as np
import tfdet
tfdet.enable(seed=0, patches=PATCHES)
import keras
inputs = keras.Input((10, 16))
h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs)
h = keras.layers.LayerNormalization()(h + inputs)
h = keras.layers.Conv1D(8, 3, strides=2)(h)
h = keras.layers.GlobalAveragePooling1D()(h)
outputs = keras.layers.Dense(1, activation="sigmoid")(h)
keras.Model(inputs, outputs).export(PATH)
"""

SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(PATH)
x = np.random.default_rng(1).standard_normal((96, 10, 16)).astype("float32")
whole = np.asarray(served.serve(x)).view(np.uint32)
rows = {}
for batch in (1, 5, 32):
    parts = [np.asarray(served.serve(x[i : i + batch])) for i in range(0, 96, batch)]
    rows[batch] = int(np.any(np.concatenate(parts).view(np.uint32) != whole, axis=1).sum())
print(json.dumps({"rows": rows, "tfdet": "tfdet" in sys.modules}))
"""


def test_an_exported_model_keeps_it_where_tfdet_is_not_imported(tmp_path):
    served = {}
    for name, patches in (
        ("default", "auto"),
        # The control: TensorFlow's own products and convolutions.
        ("tensorflow", None),
    ):
        path = str(tmp_path / name)
        exported = run_python(
            f"PATCHES, PATH = {patches!r}, {path!r}\n{EXPORT}", env=clean_env()
        )
        assert exported.returncode == 0, exported.stderr[-3000:]
        # TensorFlow's defaults there (all cores, oneDNN's ISA uncapped), but
        # oneDNN's custom ops on: the patch's products are oneDNN
        # convolutions, and where TensorFlow turns oneDNN off by itself (a
        # CPU without AVX-512, an AMD EPYC Zen 3) Eigen's convolution ran
        # them and 4 rows of a batch of 5 differed.
        result = run_python(
            f"PATH = {path!r}\n{SERVE}", env=clean_env(TF_ENABLE_ONEDNN_OPTS="1")
        )
        assert result.returncode == 0, result.stderr[-3000:]
        served[name] = last_json_line(result.stdout)
        assert served[name]["tfdet"] is False
    # Exported under the default, the SavedModel holds the compositions of
    # TensorFlow's ops (never tfdet's kernels): they need no tfdet to run.
    assert served["default"]["rows"] == {"1": 0, "5": 0, "32": 0}
    assert any(served["tensorflow"]["rows"].values()), served
