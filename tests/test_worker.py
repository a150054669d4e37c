"""The `tfdet check` worker: one fresh process records a trace and its result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import REPO, clean_env
from tfdet._child import _worker
from tfdet._protocol import _perturb, _spec
from tfdet._record import _bits, _trace
from tfdet._runner import _spawn

MODELS = f"{REPO / 'tests' / 'targets' / 'check_models.py'}"
keras = pytest.importorskip("keras")


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


def _compiled_dense(**compile_args):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], **compile_args)
    return model


def _batch(step: int):
    rng = np.random.default_rng(step)
    return rng.standard_normal((8, 4), np.float32), rng.standard_normal((8, 2))


def test_the_optimizer_and_metrics_are_built_before_the_first_step_same_weights():
    prepared, unprepared = _compiled_dense(), _compiled_dense()
    x, y = _batch(0)
    _worker._build_before_the_first_step(prepared, (x, y, None))
    # Built now, so Keras's first trace creates no variables (and runs once).
    assert prepared.optimizer.built and not unprepared.optimizer.built
    assert prepared._compile_metrics.built
    for step in range(3):
        x, y = _batch(step)
        prepared.train_on_batch(x, y)
        unprepared.train_on_batch(x, y)
    for a, b in zip(prepared.weights, unprepared.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _EagerOnly(keras.Model):
    """A model whose call needs concrete values: no symbolic build is possible."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs * float(np.asarray(inputs).std() > 0))


def test_a_model_keras_cannot_build_symbolically_builds_in_its_first_step():
    model = _EagerOnly()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    x, y = _batch(0)
    _worker._build_before_the_first_step(model, (x, y, None))
    assert not model.optimizer.built
    logs = model.train_on_batch(x, y, return_dict=True)
    assert np.isfinite(logs["loss"])
    assert model.optimizer.built
