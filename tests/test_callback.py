"""`tfdet.DeterminismCallback` in real `fit` runs, in fresh processes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import clean_env, last_json_line, run_python
from tfdet._record import _trace

# without tfdet's pinning (seeds only), ISA uncapped.
_FIT = """
import json, logging, sys, warnings
import tensorflow as tf
import keras
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tfdet
from tfdet._target import _load
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")


def build():
    keras.utils.set_random_seed(1)
    return _load.build("builtin:cnn", seed=1)


def fit(callback, built=None):
    built = built or build()
    built.model.fit(built.x, built.y, batch_size=32, epochs=2, verbose=0,
                    shuffle=False, callbacks=[callback])
    return built
"""

ENV = clean_env(ONEDNN_MAX_CPU_ISA=None)


def _run(body: str, threads: int, *args: str) -> dict:
    code = _FIT + body
    result = run_python(
        "import sys; sys.argv[1:] = " + repr([str(threads), *args]) + "\n" + code,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = last_json_line(result.stdout)
    facts["stderr"] = result.stderr
    facts["stdout"] = result.stdout
    return facts


_RECORD = """
callback = tfdet.DeterminismCallback(trace=sys.argv[2])
built = fit(callback)
first = open(sys.argv[2]).read()
# Reused for a second fit (training continues): state starts afresh.
fit(callback, built)
second = open(sys.argv[2]).read()
# every=2, variables_every=2: steps 0 and 2, per-variable fingerprints on step 0.
sparse = sys.argv[2] + ".sparse"
fit(tfdet.DeterminismCallback(trace=sparse, every=2, variables_every=2), built)
overridden = sorted(
    name for name in dir(keras.callbacks.Callback)
    if name.startswith("on_")
    and getattr(type(callback), name) is not getattr(keras.callbacks.Callback, name)
)
errors = []
for kwargs in ({"every": 0}, {"on_divergence": "explode"}, {"variables_every": -1}):
    try:
        tfdet.DeterminismCallback(**kwargs)
    except ValueError as error:
        errors.append(str(error))
# Flip one bit of one weight: the fingerprint taken on the device changes.
from tfdet._record import _bits, _trace
weights = built.model.weights
before = _trace.weights_fingerprint(_bits.weight_checksums(weights))
bits = tf.bitcast(weights[4].value, tf.uint32).numpy()
bits.flat[123] ^= 1 << 7
weights[4].assign(tf.bitcast(tf.constant(bits), tf.float32))
after = _trace.weights_fingerprint(_bits.weight_checksums(weights))
print(json.dumps({
    "steps": callback.steps_recorded, "same_file": first == second,
    "overridden": overridden, "errors": errors, "flip_changes": before != after,
}))
"""

_COMPARE = """
results = {}
for action in ("stop", "raise", "warn"):
    callback = tfdet.DeterminismCallback(reference=sys.argv[2], on_divergence=action,
                                         trace=sys.argv[3] + action)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            built = fit(callback)
            error = None
        except tfdet.DivergenceError as raised:
            error = {"step": raised.step, "quantity": raised.quantity,
                     "expected": raised.expected, "received": raised.received,
                     "epoch": raised.epoch, "message": str(raised)}
    divergence = callback.divergence
    results[action] = {
        "steps": callback.steps_recorded,
        "divergence": None if divergence is None else divergence.to_dict(),
        "error": error,
        "profile_differences": {k: list(v) for k, v in callback.profile_differences.items()},
        "warnings": [str(w.message) for w in caught],
    }
# every=2 records steps 0 and 2 only: fewer than the reference's 0, 1, 2.
sparse = tfdet.DeterminismCallback(reference=sys.argv[2], every=2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fit(sparse)
results["sparse"] = {
    "divergence": sparse.divergence is not None,
    "warnings": [str(w.message) for w in caught],
}
print(json.dumps(results))
"""


def test_records_a_trace_and_is_reusable_across_fits(tmp_path):
    path = str(tmp_path / "run.jsonl")
    facts = _run(_RECORD, 1, path)
    trace = _trace.read(path)
    # Two epochs of two batches, global steps 0..3, rewritten by the second fit.
    assert [(r["epoch"], r["step"], r["batch"]) for r in trace.steps] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 2, 0),
        (1, 3, 1),
    ]
    assert facts["steps"] == 4
    assert not facts["same_file"], "the second fit trains on: its bits differ"
    assert trace.steps[0]["loss"]["dtype"] == "float32"
    assert set(trace.steps[0]["metrics"]) == {
        "categorical_accuracy",
        "categorical_hinge",
    }
    assert len(trace.steps[0]["variables"]) == len(trace.variables) == 12
    assert trace.profile.intra_op_threads == 1
    assert trace.environment["cpu_count"] >= 1
    # Only the hooks it needs: Keras skips the batch hooks nobody overrides.
    assert facts["overridden"] == [
        "on_epoch_begin",
        "on_train_batch_end",
        "on_train_begin",
        "on_train_end",
    ]
    assert len(facts["errors"]) == 3 and "every=0" in facts["errors"][0]
    assert facts["flip_changes"]
    sparse = _trace.read(path + ".sparse")
    assert [r["step"] for r in sparse.steps] == [0, 2]
    assert ["variables" in r for r in sparse.steps] == [True, False]
    assert sparse.header["every"] == 2


def test_against_a_reference_with_another_thread_count(tmp_path):
    reference = str(tmp_path / "reference.jsonl")
    _run("fit(tfdet.DeterminismCallback(trace=sys.argv[2]))\nprint('{}')", 1, reference)
    prefix = str(tmp_path / "run_")

    # Same thread count, another process: every step matches.
    same = _run(_COMPARE, 1, reference, prefix)
    for action in ("stop", "raise", "warn"):
        assert same[action]["divergence"] is None and same[action]["error"] is None
        assert same[action]["steps"] == 4
        assert same[action]["profile_differences"] == {}
        assert same[action]["warnings"] == []
    assert "diverged" not in same["stderr"]
    # Steps of the reference left unchecked are a warning, not "all match".
    sparse = same["sparse"]
    assert not sparse["divergence"] and len(sparse["warnings"]) == 1, sparse
    assert "compared only 2 steps" in sparse["warnings"][0]
    assert "has 3 steps up to step 2" in sparse["warnings"][0]

    other = _run(_COMPARE, 2, reference, prefix)
    stop, raised, warn = other["stop"], other["raise"], other["warn"]
    # The profile difference is reported first, as a warning.
    assert stop["profile_differences"] == {"intra_op_threads": [1, 2]}
    assert "intra_op_threads=1 vs 2" in stop["warnings"][0]
    # Once per callback: as a warning only, not logged a second time.
    assert sum("another tfdet profile" in w for w in stop["warnings"]) == 1
    assert "another tfdet profile" not in other["stderr"]
    # "stop": the first diverging step, quantity and both values, logged;
    # training stopped right after it.
    divergence = stop["divergence"]
    # Which quantity differs first depends on the CPU's kernels: where the
    # forward pass follows the pool size (Eigen's, with oneDNN custom ops
    # off by TensorFlow's default on AVX2-only CPUs) the loss of step 0 does;
    # where only the gradients do, the weights after it.
    weights_first = divergence["quantity"].startswith("weights:")
    assert divergence["step"] == 0 and (
        weights_first or divergence["quantity"] == "loss"
    )
    assert stop["steps"] == divergence["step"] + 1 < 4
    log = [line for line in other["stderr"].splitlines() if "Bits diverged" in line]
    assert log and "Stopping training" in log[0]
    for fact in (
        "step 0",
        divergence["quantity"],
        divergence["expected"],
        divergence["received"],
    ):
        assert fact in log[0]
    # "raise": the exception carries the same facts; the trace stays readable.
    error = raised["error"]
    assert error is not None
    assert (error["step"], error["quantity"], error["expected"], error["received"]) == (
        divergence["step"],
        divergence["quantity"],
        divergence["expected"],
        divergence["received"],
    )
    assert error["epoch"] == 0
    assert len(_trace.read(prefix + "raise").steps) == 1
    # "warn": warns once and trains on.
    assert warn["steps"] == 4 and warn["divergence"] == divergence
    assert sum("Bits diverged" in w for w in warn["warnings"]) == 1
    # A fingerprint has no distance in ulps; a float loss has one.
    ulps = json.loads(json.dumps(divergence))["ulps"]
    assert ulps is None if weights_first else ulps > 0


_TF_KERAS_FIT = """
import json, sys
import numpy as np
import tf_keras
import tfdet
import keras

def fit(callback, model=None):
    tf_keras.utils.set_random_seed(3)
    x = np.random.default_rng(3).standard_normal((48, 6)).astype("float32")
    model = tf_keras.Sequential(
        [tf_keras.layers.Dense(8, activation="relu", input_shape=(6,)),
         tf_keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x[:, :2], batch_size=16, epochs=2, verbose=0, shuffle=False,
              callbacks=[callback])

recorder = tfdet.DeterminismCallback(trace=sys.argv[1])
fit(recorder)
checker = tfdet.DeterminismCallback(reference=sys.argv[1])
fit(checker)
print(json.dumps({
    "classes": [isinstance(recorder, base) for base in (
        tfdet.DeterminismCallback, tf_keras.callbacks.Callback,
        keras.callbacks.Callback)],
    "steps": checker.steps_recorded,
    "divergence": checker.divergence is not None,
}))
"""


@pytest.mark.tf_keras
def test_tf_keras_imported_directly(tmp_path):
    # `import tf_keras` without TF_USE_LEGACY_KERAS: tf_keras's fit checks its
    # own Callback API, which a Keras 3 callback lacks.
    path = str(tmp_path / "direct.jsonl")
    result = run_python(
        f"import sys; sys.argv[1:] = [{path!r}]\n" + _TF_KERAS_FIT,
        env=clean_env(TF_USE_LEGACY_KERAS=None),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = last_json_line(result.stdout)
    assert facts == {"classes": [True, True, True], "steps": 6, "divergence": False}
    assert len(_trace.read(path).steps) == 6


@pytest.mark.tf_keras
def test_tf_keras_fit(tmp_path):
    path = str(tmp_path / "tf_keras.jsonl")
    code = """
import json, sys
import tf_keras
import tfdet
from tfdet._target import _load
def fit(callback):
    tf_keras.utils.set_random_seed(3)
    built = _load.build("builtin:cnn_tf_keras", seed=3)
    built.model.fit(built.x, built.y, batch_size=32, epochs=2, verbose=0,
                    shuffle=False, callbacks=[callback])

recorder = tfdet.DeterminismCallback(trace=sys.argv[1])
fit(recorder)
checker = tfdet.DeterminismCallback(reference=sys.argv[1])
fit(checker)
print(json.dumps({
    "classes": [isinstance(recorder, base) for base in (
        tfdet.DeterminismCallback, tf_keras.callbacks.Callback)],
    "steps": checker.steps_recorded,
    "divergence": checker.divergence is not None,
}))
"""
    result = run_python(
        f"import sys; sys.argv[1:] = [{path!r}]\n" + code,
        env=clean_env(TF_USE_LEGACY_KERAS="1"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = last_json_line(result.stdout)
    assert facts["classes"] == [True, True]
    assert facts["steps"] == 4 and not facts["divergence"]
    trace = _trace.read(path)
    assert len(trace.steps) == 4 and trace.profile.keras == "tf_keras"


def test_bad_trace_and_reference_paths_fail_at_construction(tmp_path):
    import os

    import pytest

    import tfdet
    from tfdet._errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="missing.jsonl"):
        tfdet.DeterminismCallback(reference=tmp_path / "missing.jsonl")
    (tmp_path / "not_a_trace.jsonl").write_text("hello\n")
    with pytest.raises(TraceFormatError):
        tfdet.DeterminismCallback(reference=tmp_path / "not_a_trace.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        tfdet.DeterminismCallback(trace=tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="Expected `trace`"):
        tfdet.DeterminismCallback(trace=blocker / "sub" / "run.jsonl")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not writable"):
            tfdet.DeterminismCallback(trace=locked / "run.jsonl")
    # A directory that does not exist yet is fine: the writer creates it.
    callback = tfdet.DeterminismCallback(trace=tmp_path / "new" / "run.jsonl")
    assert callback.trace.endswith("run.jsonl")


_SUMMARY = """
import json, logging, sys
import numpy as np
import tfdet
tfdet.enable(seed=3)  # Before `import keras`, which imports TensorFlow.
import keras
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(message)s")


def fit(callback, seed):
    keras.utils.set_random_seed(seed)
    x = np.random.default_rng(3).standard_normal((48, 6)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                              keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, x[:, :2], batch_size=16, epochs=2, verbose=0,
                        shuffle=False, callbacks=[callback])
    return history.history


reference = sys.argv[1]
fit(tfdet.DeterminismCallback(trace=reference), 3)
print("MARK same", file=sys.stderr, flush=True)
same = tfdet.DeterminismCallback(reference=reference)
fit(same, 3)
print("MARK stop", file=sys.stderr, flush=True)
# Another initial seed: the weights differ from step 0.
stop = tfdet.DeterminismCallback(reference=reference)
history = fit(stop, 4)
facts = {
    "same": [same.divergence is None, same.stopped_on_divergence],
    "stop": [stop.divergence is not None, stop.stopped_on_divergence],
    "stop_epochs": len(history["loss"]),
}
# Reused: the next fit starts afresh.
fit(stop, 3)
facts["reused"] = [stop.divergence is None, stop.stopped_on_divergence]
print(json.dumps(facts))
"""


def test_end_of_fit_summary_at_warning_and_a_testable_stop(tmp_path):
    reference = str(tmp_path / "reference.jsonl")
    result = run_python(
        f"import sys; sys.argv[1:] = [{reference!r}]\n" + _SUMMARY, env=ENV
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = last_json_line(result.stdout)
    assert facts["same"] == [True, False]
    # "stop" ends fit normally (exit 0!): the attribute tells the script.
    assert facts["stop"] == [True, True]
    assert facts["stop_epochs"] == 1, "stopped in the first epoch"
    assert facts["reused"] == [True, False]
    recorded, same, stop = result.stderr.split("MARK ")
    assert f"LOG WARNING tfdet: 6 steps recorded to {reference}" in recorded
    assert f"LOG WARNING tfdet: 6 steps identical to reference {reference}" in same
    summary = [line for line in stop.splitlines() if "diverged from reference" in line]
    assert len(summary) == 1 and summary[0].startswith("LOG WARNING"), stop
    assert "step 0" in summary[0] and "training stopped" in summary[0]
    assert "use 'raise' in CI" in summary[0]
