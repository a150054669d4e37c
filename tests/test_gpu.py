"""What only a GPU can show: the patches' GPU paths and XLA determinism there.

Marked `gpu`: skipped on a machine whose nvidia-smi lists no GPU (CI, this
project's CPU machines). Run on a GPU machine with `pytest -m gpu`, with a
TensorFlow GPU build installed.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, clean_env, last_json_line, run_python, run_tfdet
from tests.targets.xla_models import MAX_POOL_XLA_GRADIENT

pytestmark = pytest.mark.gpu

XLA_MODELS = REPO / "tests" / "targets" / "xla_models.py"


def _max_pool_xla(patches: str | None) -> dict:
    code = MAX_POOL_XLA_GRADIENT.replace("PATCHES", repr(patches)).replace(
        "DEVICE", repr("/GPU:0")
    )
    result = run_python(code, env=clean_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)


def test_xla_max_pool_gradient_is_deterministic_on_gpu_only_with_the_patch():
    # Under op determinism TensorFlow's XLA bridge refuses MaxPoolGrad (and
    # XLA's SelectAndScatter has no deterministic GPU lowering); the patch's
    # gradient compiles and repeats. The CPU shows the refusal too
    # (tests/test_patch_xla_max_pool_grad.py); only a GPU shows the bits.
    refused = _max_pool_xla(None)
    assert refused.get("error") == "UnimplementedError", refused
    first, second = _max_pool_xla("auto"), _max_pool_xla("auto")
    assert "bits" in first and first == second, (first, second)


def test_check_on_gpu_with_xla_max_pool_model_is_identical(tmp_path):
    report = tmp_path / "report.json"
    result = run_tfdet(
        "check", f"{XLA_MODELS}:jit_max_pool", "--device", "gpu", "--runs", "3",
        "--perturb", "none", "--steps", "4", "--json", str(report), timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = json.loads(report.read_text())["devices"]["gpu"]["runs"]
    assert all(run["xla"]["on"] for run in runs)


HAZARD_MODELS = REPO / "tests" / "targets" / "hazard_models.py"


def _gpu_check(target: str, tmp_path, *args: str) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    result = run_tfdet(
        "check", target, "--device", "gpu", "--json", str(report), *args,
        timeout=1200,
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, data, result.stdout + result.stderr


def test_patched_gpu_ops_train_identically_on_gpu(tmp_path):
    # Bincount, ResizeNearestNeighborGrad, ScatterNd, AdjustContrast, sparse
    # Embedding updates: under op determinism alone TensorFlow refuses or
    # leaves the GPU for them; with tfdet's patches three processes agree.
    code, report, output = _gpu_check(
        f"{HAZARD_MODELS}:keras3", tmp_path, "--runs", "3", "--perturb", "none"
    )
    assert code == 0, output
    assert report["devices"]["gpu"]["status"] == "ran"


@pytest.mark.parametrize("target", ["recurrent_keras3", "bidirectional_keras3"])
def test_recurrent_layers_are_repeatable_on_gpu_under_tfdet(target, tmp_path):
    code, _, output = _gpu_check(
        f"{HAZARD_MODELS}:{target}", tmp_path, "--runs", "3", "--perturb", "none"
    )
    assert code == 0, output
