"""`tfdet check --workers/--replicas`: runs that train under tf.distribute.

A run of `--workers N` is N fresh processes of one MultiWorkerMirroredStrategy
job on loopback; each is compared with the same worker of the other runs, and
the workers of one run with each other.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import REPO, clean_env, run_tfdet
from tests.test_check import MARKER_VARIABLE, _children_of_this_check
from tests.test_check import _check as check_with_report

TARGETS = REPO / "tests" / "targets"
CHECK_MODELS = f"{TARGETS / 'check_models.py'}"


def _check(*args: str, tmp_path, env=None) -> tuple[int, dict, str]:
    """`tfdet check` on the CPU only: distributed runs are checked there."""
    return check_with_report(*args, "--device", "cpu", tmp_path=tmp_path, env=env)


@pytest.fixture(scope="module")
def two_worker_check(tmp_path_factory):
    """The built-in CNN, two workers per run, every perturbation, traces kept."""
    tmp_path = tmp_path_factory.mktemp("workers")
    traces = tmp_path / "traces"
    return (
        *_check("--workers", "2", "--traces", str(traces), tmp_path=tmp_path),
        traces,
    )


def test_two_worker_runs_are_bit_identical_under_every_perturbation(two_worker_check):
    code, report, output, traces = two_worker_check
    assert code == 0, output
    cpu = report["devices"]["cpu"]
    assert cpu["workers"] == 2 and report["workers"] == 2
    names = [run["name"] for run in cpu["runs"]]
    assert names == [
        "run 0 worker 0",
        "run 0 worker 1",
        "run 1 worker 0",
        "run 1 worker 1",
    ]
    assert all(run["ok"] and run["entry_points"] == ["fit"] for run in cpu["runs"])
    assert "affinity" in cpu["perturbations"]
    assert sorted(os.listdir(traces / "cpu")) == [
        "run0-worker0.jsonl",
        "run0-worker1.jsonl",
        "run1-worker0.jsonl",
        "run1-worker1.jsonl",
    ]
    assert "MultiWorkerMirroredStrategy" in output and "2 runs x 2 workers" in output


def test_diff_of_two_workers_shows_their_strategy_facts(two_worker_check, tmp_path):
    code, _, output, traces = two_worker_check
    assert code == 0, output
    report_path = tmp_path / "diff.json"
    proc = run_tfdet(
        "diff",
        str(traces / "cpu" / "run0-worker0.jsonl"),
        str(traces / "cpu" / "run0-worker1.jsonl"),
        "--json",
        str(report_path),
    )
    diff = json.loads(report_path.read_text())
    assert proc.returncode == 0 and diff["identical"], proc.stdout + proc.stderr
    assert diff["distribution_differences"] == {"worker": [0, 1]}
    assert "worker: 0 vs 1" in proc.stdout
    header = json.loads(
        (traces / "cpu" / "run1-worker1.jsonl").read_text().split("\n")[0]
    )
    assert header["distribution"] == {
        "strategy": "MultiWorkerMirroredStrategy",
        "replicas": 2,
        "workers": 2,
        "worker": 1,
        # enable() pinned TensorFlow's AUTO all-reduce to RING.
        "collective": "RING",
        "collective_chosen_by": "tfdet",
        "bytes_per_pack": 0,
    }


def test_without_tfdet_two_worker_runs_diverge_under_affinity(tmp_path, two_cpus):
    # The other half of the test above: the same gang under the same CPU
    # change, plain TensorFlow, does not keep its bits.
    code, report, output = _check(
        "--workers",
        "2",
        "--no-enable",
        "--perturb",
        "affinity",
        "--no-attribute",
        tmp_path=tmp_path,
    )
    assert code == 1, output
    divergence = report["devices"]["cpu"]["divergence"]
    assert divergence["runs"] == [0, 1] and divergence["worker"] == 0
    assert "run 0 worker 0 vs run 1 worker 0" in output


def test_noise_in_every_worker_diverges_at_step_0_and_names_the_worker(tmp_path):
    code, report, output = _check(
        f"{CHECK_MODELS}:urandom_model",
        "--workers",
        "2",
        "--perturb",
        "none",
        "--steps",
        "2",
        "--no-attribute",
        tmp_path=tmp_path,
    )
    assert code == 1, output
    divergence = report["devices"]["cpu"]["divergence"]
    assert (divergence["step"], divergence["worker"]) == (0, 0)
    assert report["verdict"] == "diverged"


def test_a_dead_worker_stops_its_gang_and_the_check_fails(tmp_path):
    # A copy of the target under a unique path, also put in the check's
    # environment: the process matcher sees this check's processes only.
    marker = tmp_path / "dead_worker_marker.py"
    marker.write_text(
        "from tests.targets.distribute_models import dies_on_worker_1\n"
        "def build():\n    return dies_on_worker_1()\n"
    )
    started = time.monotonic()
    code, report, output = _check(
        f"{marker}:build",
        "--workers",
        "2",
        "--perturb",
        "none",
        "--steps",
        "5",
        "--timeout",
        "300",
        tmp_path=tmp_path,
        # Marks this check's processes for the matcher below.
        env=clean_env(**{MARKER_VARIABLE: str(marker)}),
    )
    assert code == 3, output
    # Worker 0 would wait in its collective until the timeout: the gang stop
    # ends it as soon as worker 1 is gone.
    assert time.monotonic() - started < 200, output
    runs = {run["name"]: run for run in report["devices"]["cpu"]["runs"]}
    for index in (0, 1):
        assert runs[f"run {index} worker 1"]["returncode"] == 17
        assert not runs[f"run {index} worker 0"]["ok"]
        assert runs[f"run {index} worker 0"]["reason"] in (
            f"stopped after run {index} worker 1 failed",
            # Worker 0 may see the broken collective and exit on its own first.
            "exited 1",
        )
    assert "IDENTICAL" not in output
    time.sleep(1)
    assert _children_of_this_check(marker, os.getpid()) == []


def test_mirrored_replicas_in_one_process_are_bit_identical(tmp_path):
    code, report, output = _check(
        "--replicas", "2", "--traces", str(tmp_path), tmp_path=tmp_path
    )
    assert code == 0, output
    cpu = report["devices"]["cpu"]
    assert cpu["replicas"] == 2 and [run["name"] for run in cpu["runs"]] == [
        "run 0",
        "run 1",
    ]
    header = json.loads((tmp_path / "cpu" / "run0.jsonl").read_text().split("\n")[0])
    assert header["distribution"]["strategy"] == "MirroredStrategy"
    assert header["distribution"]["replicas"] == 2


@pytest.mark.parametrize(
    "flags",
    [
        ["--workers", "0"],
        ["--replicas", "0"],
        ["--workers", "2", "--replicas", "2"],
        ["--workers", "65"],
    ],
)
def test_bad_distribution_flags_exit_2(tmp_path, flags):
    code, _, output = _check(*flags, tmp_path=tmp_path)
    assert code == 2, output
    assert "Traceback" not in output and "run 0" not in output
