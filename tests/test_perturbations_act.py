"""Every perturbation a report names was applied, in every kind of run.

A check that reports an imitation it never ran is a false verdict. The
control here (`tests/targets/scripts/perturbation_control.py`) is a training
whose bits follow each perturbation that can change bits; without tfdet,
each such perturbation alone must make its runs differ, through `check
TARGET` and through `check --script` alike, while the same runs without a
perturbation agree. A run that was given an in-child perturbation and did
not confirm it is a failed run, never a perturbed one.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, check_options, clean_env, run_tfdet
from tfdet._protocol import _perturb, _spec
from tfdet._runner import _spawn

CONTROL = str(REPO / "tests" / "targets" / "scripts" / "perturbation_control.py")
# Each kind of check, as a user runs it on the control.
KINDS = {
    "target": ("check", f"{CONTROL}:build", "--steps", "1", "--no-attribute"),
    "script": ("check", "--script", CONTROL),
}
# Without tfdet: oneDNN's custom ops off (Eigen's products, which follow the
# cache sizes), one fixed hash seed (an unset one differs in every process).
PLAIN = {
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "PYTHONHASHSEED": "0",
    "TF_NUM_INTRAOP_THREADS": None,
    "TF_NUM_INTEROP_THREADS": None,
}
# Where a perturbation needs more: Eigen blocks by the L1 size with one thread.
ENVIRONMENTS = {
    "caches": {**PLAIN, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
}
# The perturbations that change bits where nothing pins what they change
# (`isa` too, on a CPU with more than AVX2).
BIT_CHANGING = ("caches", "affinity", "threads", "hashseed", "isa")


def _check(tmp_path, kind: str, perturb: str, env: dict) -> dict:
    report_path = tmp_path / f"{kind}-{perturb}.json"
    result = run_tfdet(
        *KINDS[kind],
        "--no-enable",
        "--device",
        "cpu",
        "--perturb",
        perturb,
        "--json",
        str(report_path),
        env=clean_env(**env),
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["exit_code"] == result.returncode
    return report


def _runs(report: dict) -> list[dict]:
    if "run_reports" in report:  # check --script
        return report["run_reports"]
    return report["devices"]["cpu"]["runs"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", BIT_CHANGING)
def test_each_bit_changing_perturbation_separates_the_control(tmp_path, kind, name):
    reason = check_options(perturb=(name,), cpu_isa=None).plan().skipped.get(name)
    if reason is not None:
        pytest.skip(f"{name} does not apply on this machine: {reason}")
    report = _check(tmp_path, kind, name, ENVIRONMENTS.get(name, PLAIN))
    baseline, other = _runs(report)
    assert baseline["perturbations"][name] != other["perturbations"][name]
    assert report["exit_code"] == 1, f"{name} was reported but changed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_control_runs_agree_without_a_perturbation(tmp_path, kind):
    # The divergences above come from the perturbations, not from the control.
    assert _check(tmp_path, kind, "none", ENVIRONMENTS["caches"])["exit_code"] == 0
    assert _check(tmp_path, kind, "none", PLAIN)["exit_code"] == 0


def test_a_run_that_does_not_apply_its_in_child_perturbation_fails(tmp_path):
    # A stand-in child that writes a result (a preflight child's: nothing of
    # its own) but applies nothing itself.
    (tmp_path / "lazy_child.py").write_text(
        "import json, sys\n"
        "spec = json.loads(sys.argv[1])\n"
        "json.dump({'perturbations_applied': {}}, open(spec['result'], 'w'))\n"
    )
    setups = [
        _perturb.RunSetup(index, {"caches": change})
        for index, change in enumerate(
            _perturb.REGISTRY["caches"].change(k, _perturb.Context(2, None, 1))
            for k in range(2)
        )
    ]
    baseline, perturbed = _spawn.run_all(
        setups,
        _spec.WorkerSpec(_spec.PREFLIGHT),
        str(tmp_path),
        module="lazy_child",
        base_env=clean_env(PYTHONPATH=str(tmp_path)),
        timeout=120.0,
    )
    assert baseline.ok  # Nothing asked of it.
    assert not perturbed.ok
    assert "did not apply the caches perturbation" in perturbed.reason
