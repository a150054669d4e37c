"""TARGET parsing, loading and data synthesis."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import REPO
from tfdet._errors import RunFailedError, TargetError
from tfdet._runner import _preflight
from tfdet._target import _load

MODELS = str(REPO / "tests" / "targets" / "check_models.py")


@pytest.mark.parametrize("text", ["nocolon", ":f", "mod:", "builtin:unknown"])
def test_malformed_targets_are_refused(text):
    with pytest.raises(TargetError):
        _load.parse(text)


def test_default_is_the_builtin_cnn():
    assert _load.parse(None).text == "builtin:cnn"
    assert _load.parse("builtin:cnn_tf_keras").legacy_keras


def test_file_target_with_data_uses_it():
    built = _load.build(f"{MODELS}:with_data")
    assert not built.synthesized and built.batch_size == 32
    x0, _ = built.batch(0)
    x2, _ = built.batch(2)  # cycles through 64 samples
    assert np.array_equal(x0, x2)


def test_synthesized_data_is_seeded_and_fits_embeddings():
    a = _load.build("builtin:embedding", seed=1)
    b = _load.build("builtin:embedding", seed=1)
    c = _load.build("builtin:embedding", seed=2)
    assert a.synthesized and a.x.dtype == np.int32
    # The Embedding's vocabulary of 1000, not the default of 2.
    assert a.x.min() >= 0 and 2 < a.x.max() < 1000
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert set(np.unique(a.y)) <= {0.0, 1.0}


def test_synthesized_integers_fit_the_smallest_embedding_nested_ones_included():
    import keras

    inner = keras.Sequential(
        [keras.layers.Embedding(7, 4), keras.layers.GlobalAveragePooling1D()]
    )
    model = keras.Sequential(
        [keras.Input((64,), dtype="int32"), inner, keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    x, _ = _load.synthesize(model, seed=0)
    assert x.min() == 0 and x.max() == 6


def test_categorical_labels_are_one_hot():
    built = _load.build("builtin:cnn")
    assert built.y.shape == (64, 10) and np.all(built.y.sum(axis=1) == 1)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("not_a_model", "compiled Keras model"),
        ("uncompiled_model", "compile"),
        ("nope", "nope"),
    ],
)
def test_bad_functions_are_refused(function, message):
    with pytest.raises(TargetError, match=message):
        _load.build(f"{MODELS}:{function}")


FAULTS = str(REPO / "tests" / "targets" / "fault_models.py")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (f"{FAULTS}:exits_zero", r"called sys\.exit\(0\) while being built"),
        (
            f"{REPO / 'tests' / 'targets' / 'exits_at_import.py'}:build",
            r"called sys\.exit\(0\) while .*exits_at_import\.py' was imported",
        ),
        (f"{FAULTS}:no_loss", "compiled with a loss"),
        (f"{FAULTS}:length_mismatch", "64 in x, 32 in y"),
        (f"{FAULTS}:zero_samples", "0 samples"),
        (f"{FAULTS}:strings_as_data", "Received: x=str"),
        (f"{MODELS}:not_a_model", "Received: str"),
    ],
)
def test_targets_that_exit_or_return_unusable_data_are_target_errors(target, message):
    with pytest.raises(TargetError, match=message):
        _load.build(target)


def test_dataset_elements_without_labels_are_refused():
    built = _load.build(f"{FAULTS}:tf_dataset_without_labels")
    with pytest.raises(TargetError, match=r"\(x, y\)"):
        built.batch(0)


def test_tf_dataset_batches_are_taken_in_order_and_cycle():
    built = _load.build(f"{FAULTS}:tf_dataset")
    x, y = _xy()
    assert not built.synthesized
    for step, start in [(0, 0), (1, 16), (3, 48), (4, 0), (9, 16)]:
        bx, by = built.batch(step)
        assert np.array_equal(bx, x[start : start + 16])
        assert np.array_equal(by, y[start : start + 16])
    assert built.sample_weight(0) is None


def test_sample_weights_and_py_datasets_are_data():
    weighted = _load.build(f"{FAULTS}:tf_dataset_weighted")
    assert np.asarray(weighted.sample_weight(1)).shape == (16,)
    assert len(weighted.batch(1)) == 2
    py = _load.build(f"{FAULTS}:py_dataset")
    x, _ = _xy()
    assert np.array_equal(py.batch(5)[0], x[16:32])  # 4 batches: step 5 is the 2nd


def _xy():
    from tests.targets import fault_models

    return fault_models._xy()


@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        # os._exit cannot be caught in-process: only a child survives it.
        ("os_exits_zero", TargetError, r"ended \(exit status 0\)"),
        (
            "wrong_input_shape",
            TargetError,
            r"\(batch, 8\)\. Received: a batch of shape \(32, 5\)",
        ),
        ("hangs", RunFailedError, "within `timeout=5` seconds"),
    ],
)
def test_preflight_survives_targets_that_exit_hang_or_do_not_fit(
    function, error, message
):
    spec = _load.parse(f"{FAULTS}:{function}")
    with pytest.raises(error, match=message):
        _preflight.preflight(spec, timeout=5 if function == "hangs" else 300)


def test_preflight_accepts_a_good_target():
    # Preflight raises on a TARGET it refuses; a good one returns None.
    assert (
        _preflight.preflight(_load.parse(f"{FAULTS}:tf_dataset"), timeout=300) is None
    )
