"""The `batch` perturbation: which batches a run predicts in, and the report.

The order and sizes are shared by the child that predicts and the parent
that compares (`tfdet._protocol._predict`); a check with `--perturb batch`
diverges at the first sample whose prediction follows its batch (the
default profile, on a CNN) and is identical where none does (the opt-in
`pool_size_free_products`), in fresh processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TENSORFLOW_PRODUCTS, run_checks_side_by_side
from tfdet._protocol import _predict
from tfdet._protocol._result import CheckResult


@pytest.mark.parametrize("samples", [1, 6, 37, 64])
def test_a_split_run_predicts_every_sample_once_in_batches_of_1_5_32(samples):
    chunks = _predict.batches(samples, _predict.SPLIT)
    assert sorted(index for chunk in chunks for index in chunk) == list(range(samples))
    sizes = [len(chunk) for chunk in chunks]
    # In turn, the last one cut short by the samples left.
    expected = [(1, 5, 32)[turn % 3] for turn in range(len(chunks))]
    assert sizes[:-1] == expected[:-1] and 1 <= sizes[-1] <= expected[-1]
    if samples > 6:
        # Another order: a sample sits elsewhere than in the whole batch.
        assert [i for chunk in chunks for i in chunk] != list(range(samples))


def test_a_whole_run_predicts_in_one_batch_in_order():
    assert _predict.batches(5, _predict.WHOLE) == [[0, 1, 2, 3, 4]]


def test_the_first_sample_predicted_apart_is_named_with_its_batches():
    whole = CheckResult(predictions=("a", "b", "c"), prediction_batches=((3, 0),) * 3)
    split = CheckResult(
        predictions=("a", "x", "c"), prediction_batches=((1, 0), (5, 3), (5, 0))
    )
    quantity, expected, received = _predict.first_difference(whole, split)
    assert quantity == "prediction of sample 1 (in a batch of 3; then of 5, at place 3)"
    assert (expected, received) == ("b", "x")
    assert _predict.first_difference(whole, whole) is None
    # A run that did not predict (no batch perturbation) compares nothing.
    assert _predict.first_difference(CheckResult(), split) is None


def test_check_batch_diverges_without_the_patch_and_not_with_it(tmp_path: Path):
    outputs, codes, reports = run_checks_side_by_side(
        ["builtin:cnn", "--steps", "2", "--device", "cpu", "--perturb", "batch",
         "--no-attribute"],
        {
            "with": [],  # The default.
            # TensorFlow's own products and convolutions.
            "without": ["--patches", TENSORFLOW_PRODUCTS],
        },
        tmp_path,
    )  # fmt: skip
    assert codes == {"with": 0, "without": 1}, outputs
    report = reports["with"]
    assert list(report["varied"]) == ["batch"] and not report["imitated"]
    baseline, other = report["devices"]["cpu"]["runs"]
    assert "in one batch" in baseline["perturbations"]["batch"]
    assert "batches of 1, 5, 32" in other["perturbations"]["batch"]
    divergence = reports["without"]["devices"]["cpu"]["divergence"]
    assert divergence["quantity"].startswith("prediction of sample")
    assert "prediction of sample" in outputs["without"]
