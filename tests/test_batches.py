"""The batch each training step trained on: its fingerprint and its check.

A resumed run that trains other batches (another order, a lost position)
must be reported as such, at the first step whose batch differs, before the
loss and weights that follow from it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import clean_env, run_python
from tfdet._record import _diff

tf = pytest.importorskip("tensorflow")

from tfdet._record import _batches  # noqa: E402  (after TensorFlow)


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    return rng.rand(8, 4).astype(np.float32), rng.randint(0, 3, 8)


def test_one_flipped_bit_anywhere_in_the_batch_changes_its_fingerprint():
    x, y = _batch()
    weights = np.ones(8, np.float32)
    reference = _batches.fingerprint((x, y, weights))
    assert reference == _batches.fingerprint((x.copy(), y.copy(), weights.copy()))
    for part in (x, y, weights):
        flipped = [x.copy(), y.copy(), weights.copy()]
        index = [p is part for p in (x, y, weights)].index(True)
        flipped[index].view(np.uint8).reshape(-1)[5] ^= 1
        assert _batches.fingerprint(tuple(flipped)) != reference


def test_the_shape_and_the_place_of_a_tensor_count_not_only_its_bits():
    x, y = _batch()
    assert _batches.fingerprint((x, y)) != _batches.fingerprint((x.reshape(4, 8), y))
    assert _batches.fingerprint((x, y)) != _batches.fingerprint((y, x))
    # No sample weights is the same batch as the pair.
    assert _batches.fingerprint((x, y, None)) == _batches.fingerprint((x, y))


def test_string_and_dict_inputs_have_fingerprints():
    words = tf.constant(["a", "b"])
    first = _batches.fingerprint(({"text": words}, np.array([0, 1])))
    second = _batches.fingerprint(({"text": tf.constant(["a", "c"])}, np.array([0, 1])))
    assert first != second


def test_a_different_batch_is_the_first_difference_of_a_step():
    step = {"step": 3, "epoch": 0, "loss": None, "weights": "w", "data": "aa"}
    other = {**step, "data": "bb", "weights": "v"}
    divergence = _diff.compare_steps(step, other)
    assert (divergence.quantity, divergence.step) == ("data", 3)
    assert "data: expected 'aa', received 'bb'" in divergence.describe()
    # A record without it (an older trace, a custom loop) compares the rest.
    assert _diff.compare_steps({**step, "data": None}, other).quantity == "weights"
    assert _diff.compare_steps(step, {**step}) is None


_FIT = """
import json, sys
import numpy as np
import tfdet
from tfdet._record import _batches

tfdet.enable()  # Before Keras imports TensorFlow: it pins oneDNN.
import keras
rng = np.random.RandomState(0)
x = rng.rand(32, 4).astype("float32")
y = rng.randint(0, 2, 32)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile(
    "sgd",
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    jit_compile={jit},
)
weights = len(model.weights)
for number in (1, 2):  # A second fit keeps the watch of the first.
    model.fit(
        x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
        callbacks=[tfdet.DeterminismCallback(sys.argv[number])],
    )
print(json.dumps({{
    "weights": [weights, len(model.weights)],
    "expected": [_batches.fingerprint((x[i:i + 8], y[i:i + 8])) for i in range(0, 32, 8)],
}}))
"""


@pytest.mark.parametrize("jit", [False, True])
def test_a_fit_trace_holds_each_steps_batch_with_and_without_xla(tmp_path, jit):
    traces = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    code = (
        "import sys; sys.argv = ['fit', "
        + ", ".join(repr(str(t)) for t in traces)
        + "]\n"
        + _FIT.format(jit=jit)
    )
    result = run_python(code, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    # The watch is no weight of the model.
    assert facts["weights"][0] == facts["weights"][1]
    for trace in traces:
        steps = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
        assert [s["data"] for s in steps] == facts["expected"]
