"""TARGET files that choose tf_keras themselves (TF_USE_LEGACY_KERAS)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, clean_env, run_tfdet
from tfdet._errors import EXIT_OK, EXIT_USAGE

FILE_TARGET = f"{REPO / 'tests' / 'targets' / 'legacy_keras_target.py'}:build"
MODULE_TARGET = "tests.targets.legacy_keras_target:build"
ARGS = ("--device", "cpu", "--perturb", "none", "--steps", "1")


@pytest.mark.slow
def test_file_target_that_sets_legacy_keras_builds_with_tf_keras():
    # The target asserts it built a tf_keras model, as under `python`; built
    # after Keras 3 was imported, it silently got a Keras 3 model instead.
    proc = run_tfdet(
        "check", FILE_TARGET, *ARGS, env=clean_env(TF_USE_LEGACY_KERAS=None)
    )
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr


@pytest.mark.slow
def test_module_target_that_sets_legacy_keras_too_late_is_a_usage_error():
    proc = run_tfdet(
        "check", MODULE_TARGET, *ARGS, env=clean_env(TF_USE_LEGACY_KERAS=None), cwd=REPO
    )
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "Set TF_USE_LEGACY_KERAS=1 in the environment" in proc.stderr


@pytest.mark.slow
@pytest.mark.tf_keras
def test_module_target_with_legacy_keras_in_the_environment_runs():
    proc = run_tfdet(
        "check", MODULE_TARGET, *ARGS, env=clean_env(TF_USE_LEGACY_KERAS="1"), cwd=REPO
    )
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
