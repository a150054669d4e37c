"""The `tfdet check` worker: one fresh process records a trace and its result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import REPO, clean_env
from tfdet._protocol import _perturb, _spec
from tfdet._record import _bits, _trace
from tfdet._runner import _spawn

MODELS = f"{REPO / 'tests' / 'targets' / 'check_models.py'}"


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory):
    """One worker process training `with_data` for 2 steps."""
    workdir = tmp_path_factory.mktemp("worker")
    steps = []
    (outcome,) = _spawn.run_all(
        [_perturb.RunSetup(0)],
        _spec.WorkerSpec(
            _spec.CHECK,
            target=f"{MODELS}:with_data",
            seed=3,
            steps=2,
            enable=True,
            threads=1,
            cpu_isa="AVX2",
        ),
        str(workdir),
        base_env=clean_env(CUDA_VISIBLE_DEVICES="-1"),
        timeout=300,
        progress=lambda index, done, total: steps.append((index, done, total)),
    )
    assert outcome.ok, outcome.stderr_tail
    spec = {"trace": str(workdir / "run0.jsonl")}
    # The file as the child wrote it, and the parent's typed record of it.
    written = json.loads((workdir / "run0.json").read_text())
    return spec, outcome.result, steps, written


def test_progress_counts_the_steps_on_its_own_channel(worker_run):
    _, _, steps, _ = worker_run
    assert steps == [(0, 1, 2), (0, 2, 2)]


def test_the_trace_is_the_callbacks_format(worker_run):
    spec, result, _, _ = worker_run
    assert result.trace == spec["trace"]
    trace = _trace.read(spec["trace"])
    assert trace.header["format"] == _trace.FORMAT
    assert trace.header["version"] == _trace.VERSION
    assert trace.profile is not None and trace.profile.seed == 3
    assert trace.profile.intra_op_threads == 1
    assert trace.environment  # the `tfdet env` fingerprint
    assert trace.variables == list(result.variables)
    assert [record["step"] for record in trace.steps] == [0, 1]
    for record in trace.steps:
        assert record["loss"]["dtype"] == "float32"
        assert len(record["variables"]) == len(trace.variables)
    # The last step's fingerprints are those of the saved final weights.
    with np.load(result.weights_file) as saved:
        final = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert {
        name: _bits.array_digest(value)
        for name, value in zip(result.variables, final, strict=True)
    } == result.final_weights
    # ... and its per-variable fingerprints, recomputed here, match them.
    checksums = _bits.device_checksums(final)
    assert trace.steps[-1]["variables"] == _bits.checksum_hex(checksums)
    assert trace.steps[-1]["weights"] == _trace.weights_fingerprint(checksums)


def test_the_result_names_the_run_facts(worker_run):
    _, result, _, written = worker_run
    assert result.profile["seed"] == 3 and result.entry_points == ("train_on_batch",)
    # What the child writes for a person reading the file, beside it.
    assert written["steps_recorded"] == 2
    assert written["synthesized_data"] is False
    assert "affinity" in written["environment"]
