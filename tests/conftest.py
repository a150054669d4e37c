"""Shared fixtures: fresh-process runners with controlled environments.

Reproducibility is a property of fresh processes, and TensorFlow's global state
(thread pools, op determinism, seeds) cannot be undone inside one, so tests
that touch it spawn `sys.executable` here instead of mutating the test process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from tfdet._pin._environment import DETERMINISM_VARIABLES
from tfdet._runs._spawn import child_environment

REPO = Path(__file__).resolve().parents[1]

# No example database, and Hypothesis's other caches (e.g. `constants/`) in
# the temp directory: tests leave no `.hypothesis/` directory in the repo.
settings.register_profile("tfdet", database=None)
settings.load_profile("tfdet")
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "tfdet-hypothesis")


def _gpu_listed() -> bool:
    """Whether nvidia-smi lists a GPU (without importing TensorFlow here)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def pytest_collection_modifyitems(config, items) -> None:
    """Skips the tests marked `gpu` on a machine without an NVIDIA GPU, and
    those marked `tf_keras` where tf_keras is not installed (the oldest
    combination of the version matrix has none)."""
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if gpu_tests and not _gpu_listed():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi lists none)")
        for item in gpu_tests:
            item.add_marker(skip)
    if importlib.util.find_spec("tf_keras") is None:
        skip = pytest.mark.skip(reason="tf_keras is not installed")
        for item in items:
            if "tf_keras" in item.keywords:
                item.add_marker(skip)


def clean_env(**overrides: str | None) -> dict[str, str]:
    """os.environ without determinism variables, plus `overrides` (None unsets)."""
    env = {k: v for k, v in os.environ.items() if k not in DETERMINISM_VARIABLES}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    return child_environment(env, overrides)


def run_python(
    code: str,
    *,
    env: dict[str, str] | None = None,
    cpus: Sequence[int] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; `cpus` restricts its CPU affinity."""
    preexec = None
    if cpus is not None:
        cpu_set = set(cpus)

        def preexec() -> None:
            os.sched_setaffinity(0, cpu_set)

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,
        check=False,
    )


def run_tfdet(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd=None
) -> subprocess.CompletedProcess:
    """Runs the `tfdet` CLI in a fresh process (`python -m tfdet ...`)."""
    return subprocess.run(
        [sys.executable, "-m", "tfdet", *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def last_json_line(stdout: str) -> dict:
    """The last line of `stdout` that parses as a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{stdout}")


@pytest.fixture
def two_cpus() -> tuple[int, int]:
    """Two CPUs this process may use, or skip (affinity tests need two)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        pytest.skip("CPU affinity is not available on this platform")
    if len(cpus) < 2:
        pytest.skip("affinity perturbation needs at least 2 CPUs")
    return cpus[0], cpus[1]
