"""A model's own `train_step` under `tfdet check`: fed as `fit` feeds it.

The models are those of keras.io's guide "Customizing what happens in
`fit()`" (tests/targets/guide_models.py), whose `train_step` begins with
`x, y = data`: Keras 3's `train_on_batch` hands it `(x, y, None)`.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, run_tfdet

from tfdet._target import _feeding

GUIDE = str(REPO / "tests" / "targets" / "guide_models.py")


def _check(target: str, *args: str, tmp_path) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", f"{GUIDE}:{target}", "--device", "cpu", "--steps", "2",
        "--no-attribute", *args, "--json", str(report_path),
    )  # fmt: skip
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


def test_a_batch_without_sample_weight_is_packed_as_fit_packs_it():
    x, y, w = object(), object(), object()
    assert _feeding._as_fit_packs((x, y, None)) == (x, y)
    assert _feeding._as_fit_packs((x, y, w)) == (x, y, w)
    # What is not train_on_batch's tuple passes as it is.
    assert _feeding._as_fit_packs((x, None)) == (x, None)
    assert _feeding._as_fit_packs([x, y, None]) == [x, y, None]


def test_a_batch_is_described_by_structure_not_values():
    class Array:
        dtype = type("DType", (), {"name": "float32"})()
        shape = (32, 8)

    assert _feeding._describe((Array(), None)) == "(float32 (32, 8), None)"
    assert _feeding._describe({"image": Array()}) == "{'image': float32 (32, 8)}"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["compute_loss_model", "lower_level_model"])
def test_the_keras_io_guide_models_train_under_check_and_their_control_differs(
    target, tmp_path
):
    # Before: exit 3, "too many values to unpack (expected 2)" from inside
    # Keras. The control shows that the check's perturbations separate these
    # models without tfdet, so identical is tfdet's doing.
    code, report, output = _check(target, "--control", tmp_path=tmp_path)
    assert code == 0, output
    assert report["verdict"] == "identical"
    assert report["control"]["verdict"] == "diverged", output
    assert "Traceback" not in output
    # The report says what the model's own step was fed.
    assert "into the train_step of " in output
    assert "given (x, y) as fit gives it" in output


@pytest.mark.slow
def test_a_train_step_that_cannot_take_the_batch_is_named_with_exit_2(tmp_path):
    code, _, output = _check(
        "batch_unpacking_model", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == 2, output
    assert "train_step of BatchUnpackingModel (guide_models.py, line" in output
    assert "Received: (float32 (32, 64), float32 (32, 1))" in output
    assert "tfdet check --script" in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_scan_traces_a_guide_models_own_train_step():
    # Before: "Tracing the training step ... failed: ValueError('too many
    # values to unpack (expected 2)')", from scan's warm-up train_on_batch.
    proc = run_tfdet("scan", f"{GUIDE}:compute_loss_model")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU hazards under op determinism: none" in proc.stdout
