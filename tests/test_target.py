"""TARGET parsing, loading and data synthesis."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import REPO
from tfdet._errors import TargetError
from tfdet._runs import _target

MODELS = str(REPO / "tests" / "targets" / "check_models.py")


@pytest.mark.parametrize("text", ["nocolon", ":f", "mod:", "builtin:unknown"])
def test_malformed_targets_are_refused(text):
    with pytest.raises(TargetError):
        _target.parse(text)


def test_default_is_the_builtin_cnn():
    assert _target.parse(None).text == "builtin:cnn"
    assert _target.parse("builtin:cnn_tf_keras").legacy_keras


def test_file_target_with_data_uses_it():
    built = _target.build(f"{MODELS}:with_data")
    assert not built.synthesized and built.batch_size == 32
    x0, _ = built.batch(0)
    x2, _ = built.batch(2)  # cycles through 64 samples
    assert np.array_equal(x0, x2)


def test_synthesized_data_is_seeded_and_fits_embeddings():
    a = _target.build("builtin:embedding", seed=1)
    b = _target.build("builtin:embedding", seed=1)
    c = _target.build("builtin:embedding", seed=2)
    assert a.synthesized and a.x.dtype == np.int32
    assert a.x.min() >= 0 and a.x.max() < 1000
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert set(np.unique(a.y)) <= {0.0, 1.0}


def test_categorical_labels_are_one_hot():
    built = _target.build("builtin:cnn")
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
        _target.build(f"{MODELS}:{function}")
