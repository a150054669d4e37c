"""`tfdet env`: the environment fingerprint, for humans and as JSON."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

import tfdet
from tests.conftest import clean_env, run_tfdet
from tfdet._cli import main
from tfdet._errors import EXIT_USAGE
from tfdet._pin import _environment
from tfdet._pin._environment import DETERMINISM_VARIABLES


def test_env_prints_the_fingerprint_and_writes_parseable_json(tmp_path: Path) -> None:
    report = tmp_path / "env.json"
    result = run_tfdet(
        "env", "--json", str(report), env=clean_env(TF_DETERMINISTIC_OPS="1")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(report.read_text())
    assert facts["tfdet"] == tfdet.__version__
    assert facts["tensorflow"] == importlib.metadata.version(
        facts["tensorflow_distribution"]
    )
    assert facts["keras"] == "keras3"
    assert facts["cpu_count"] == os.cpu_count()
    assert facts["affinity"] == sorted(os.sched_getaffinity(0))
    assert set(facts["env"]) == set(DETERMINISM_VARIABLES)
    assert facts["env"]["TF_DETERMINISTIC_OPS"] == "1"
    assert facts["env"]["PYTHONHASHSEED"] is None
    assert isinstance(facts["gpus"], list)
    assert {"cuda_build", "cuda_version", "cudnn_version"} <= set(facts)
    assert facts["profile"] is None
    # The CPU facts that decide bits (see tests/test_environment.py).
    cpu = _environment.cpu_facts()
    for name in ("cpu_vendor", "cpu_family", "cpu_model_number", "cpu_caches"):
        assert facts[name] == cpu[name]
    assert facts["cpu_isa_in_force"] == facts["cpu_isa_best"]  # No cap preset.
    assert facts["onednn_custom_ops"] in (True, False, None)
    # The human report carries the same facts.
    assert f"tensorflow: {facts['tensorflow']}" in result.stdout
    assert "TF_DETERMINISTIC_OPS=1" in result.stdout
    assert "PYTHONHASHSEED=(unset)" in result.stdout
    assert "(tfdet not enabled)" in result.stdout
    assert f"cpu_vendor: {facts['cpu_vendor']}" in result.stdout
    assert f"cpu_caches: {' '.join(facts['cpu_caches'])}" in result.stdout


def test_env_under_tfdet_run_reports_the_active_profile(tmp_path: Path) -> None:
    report = tmp_path / "env.json"
    result = run_tfdet(
        "run", "--seed", "5", "-m", "tfdet", "env", "--json", str(report)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(report.read_text())
    assert facts["profile"]["seed"] == 5
    assert facts["op_determinism"] is True
    assert facts["env"]["PYTHONHASHSEED"] == "5"
    assert "seed: 5" in result.stdout
    if facts["cpu_isa_best"] is not None:  # x86-64: enable() caps at AVX2.
        assert facts["cpu_isa_in_force"] == "AVX2"


def test_fingerprint_without_tensorflow_has_machine_facts() -> None:
    facts = _environment.fingerprint(include_tensorflow=False)
    assert "tensorflow" not in facts
    assert facts["cpu_model"]
    assert isinstance(facts["cpu_isa_flags"], list)
    json.dumps(facts)  # JSON-ready.


@pytest.mark.parametrize(
    "argv",
    [["env", "--json"], ["env", "--bogus"], ["env", "extra"]],
    ids=["json-without-file", "unknown-flag", "extra-argument"],
)
def test_env_usage_errors_exit_2(argv: list[str]) -> None:
    assert main(["tfdet", *argv]) == EXIT_USAGE
