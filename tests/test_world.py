"""The programs people write, under `check`, `check --script` and `cost`.

tests/world/ holds eleven scripts after keras.io examples, TensorFlow's
guides and Keras applications trained from scratch (their docstrings name
each). Each runs from a copy of that directory, the user's tree here, which
must keep every byte. Every check runs with its control (the same runs
without tfdet), which must differ: identical is then tfdet's doing.

CI runs the cases in `IN_CI` (each kind of program, a few minutes on two
cores); `pytest --world` runs them all.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO, run_tfdet, tree_digest

WORLD = REPO / "tests" / "world"
# Modules with a `build()` TARGET; the GAN and the VAE train on images
# alone (no labels for `check` to feed), so they are scripts only.
TARGETS = [
    "mnist_convnet",
    "image_classification_from_scratch",
    "text_classification",
    "timeseries_transformer",
    "unet_segmentation",
    "lstm_text_generation",
    "mobilenet_v3_from_scratch",
    "pydataset_callbacks",
    "custom_training_loop",
]
SCRIPTS = [*TARGETS, "dcgan", "vae"]
# What CI runs: a convolution net with augmentation, an attention model, a
# recurrent one, a PyDataset with callbacks that append to a log, a custom
# loop, a GAN's two optimizers and a ModelCheckpoint; cost on one.
IN_CI = {
    ("check", "image_classification_from_scratch"),
    ("check", "timeseries_transformer"),
    ("check", "lstm_text_generation"),
    ("script", "pydataset_callbacks"),
    ("script", "custom_training_loop"),
    ("script", "dcgan"),
    ("script", "mnist_convnet"),
    ("cost", "text_classification"),
}


def _cases(kind: str, names: list[str]) -> list:
    return [
        pytest.param(
            name,
            marks=[pytest.mark.slow]
            + ([] if (kind, name) in IN_CI else [pytest.mark.world]),
        )
        for name in names
    ]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of tests/world/ with a log the user keeps, in a tree of its own."""
    tree = tmp_path / "work" / "project"
    shutil.copytree(WORLD, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "history.csv").write_text("epoch,loss\n0,1.0\n")  # Appended to.
    return tree


def _run(project: Path, *args: str) -> tuple[int, dict, str]:
    report_path = project.parent.parent / "report.json"
    proc = run_tfdet(*args, "--json", str(report_path), cwd=project, timeout=900)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", _cases("check", TARGETS))
def test_check_of_a_published_model_is_identical_and_its_control_is_said(name, project):
    before = tree_digest(project.parent)
    code, report, output = _run(
        project, "check", f"{name}.py:build", "--device", "cpu", "--steps", "2",
        "--no-attribute", "--control",
    )  # fmt: skip
    assert code == 0, output
    assert report["verdict"] == "identical"
    # Without tfdet the perturbations separate every one of them (measured:
    # the first kernel's weights differ after step 0).
    assert report["control"]["verdict"] == "diverged", output
    assert "Traceback" not in output
    assert tree_digest(project.parent) == before


@pytest.mark.parametrize("name", _cases("script", SCRIPTS))
def test_check_script_of_a_published_program_is_identical_and_writes_nothing_of_yours(
    name, project
):
    # The control: without tfdet, nothing seeds these scripts, so their runs
    # differ; the check must say so (it can fail).
    before = tree_digest(project.parent)
    code, report, output = _run(
        project, "check", "--script", f"{name}.py", "--max-steps", "3",
        "--no-attribute", "--control",
    )  # fmt: skip
    assert code == 0, output
    assert report["isolation"], output
    assert report["control"]["verdict"] == "diverged", output
    assert "Traceback" not in output
    assert tree_digest(project.parent) == before


@pytest.mark.parametrize("name", _cases("cost", TARGETS))
def test_cost_of_a_published_model_measures_every_setting(name, project):
    before = tree_digest(project.parent)
    code, report, output = _run(
        project, "cost", f"{name}.py:build", "--device", "cpu", "--rounds", "1",
        "--blocks", "1", "--steps", "1", "--warmup", "1",
    )  # fmt: skip
    assert code == 0, output
    assert report["rows"] and all(row["ms_per_step"] > 0 for row in report["rows"]), (
        output
    )
    assert "Traceback" not in output
    assert tree_digest(project.parent) == before
    assert os.listdir(project.parent) == ["project"]


@pytest.mark.parametrize("name", _cases("cost", ["dcgan", "vae"]))
def test_cost_script_of_a_published_program_without_a_target(name, project):
    # The GAN and the VAE train on images alone: no TARGET, their script.
    before = tree_digest(project.parent)
    code, report, output = _run(
        project, "cost", "--script", f"{name}.py", "--rounds", "1", "--blocks", "1",
        "--steps", "1", "--warmup", "1",
    )  # fmt: skip
    assert code == 0, output
    assert report["rows"] and all(row["ms_per_step"] > 0 for row in report["rows"])
    assert "Traceback" not in output
    assert tree_digest(project.parent) == before
