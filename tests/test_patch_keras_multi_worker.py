"""The `keras_multi_worker` patch: Keras 3 `fit` under a 2-worker strategy.

Two fresh worker processes form a `MultiWorkerMirroredStrategy` cluster on
loopback (TF_CONFIG, free ports) and train one epoch with `model.fit`. Without
the patch Keras 3.15 fails before the first step (keras-team/keras#20585);
with it both workers finish with the same weights, and those are the weights
of a 2-replica `MirroredStrategy` in one process: the patch changes which
eager value Keras reads shapes from, not the all-reduce.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import clean_env, run_python
from tfdet._runner import _cluster

pytest.importorskip("tensorflow")

_MODEL = """
    import hashlib, json, os, sys
    import numpy as np
    import tensorflow as tf
    import keras
    {setup}
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ])
        model.compile("adam", "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    weights = b"".join(w.tobytes() for w in model.get_weights())
    print("DIGEST", hashlib.sha256(weights).hexdigest())
"""

_WORKER = """
    {patch}
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
"""

_MIRRORED = """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
"""

_PATCH = """
    from tfdet._patching import _registry
    _registry.install(["keras_multi_worker"])
"""


def _code(setup: str) -> str:
    return textwrap.dedent(_MODEL).replace("{setup}", textwrap.dedent(setup).strip())


def _two_workers(patch: bool) -> list[subprocess.CompletedProcess]:
    ports = _cluster.free_ports(2)
    setup = _WORKER.replace("{patch}", _PATCH if patch else "")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _code(setup)],
            env=clean_env(TF_CONFIG=_cluster.cluster_config(ports, index)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
    results = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=240)
        finally:
            process.kill()
        results.append(
            subprocess.CompletedProcess(
                process.args, process.returncode, stdout, stderr
            )
        )
    return results


def _digest(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return next(
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.startswith("DIGEST")
    )


def test_two_workers_fail_without_the_patch() -> None:
    results = _two_workers(patch=False)
    assert all(result.returncode != 0 for result in results)
    assert "PerReplica" in results[0].stderr


def test_two_workers_train_with_the_patch_as_two_local_replicas_do() -> None:
    workers = [_digest(result) for result in _two_workers(patch=True)]
    mirrored = _digest(run_python(_code(_MIRRORED)))
    assert workers == [mirrored, mirrored]


def test_patch_is_installed_by_enable_for_keras_3() -> None:
    result = run_python(
        """
        import tfdet
        tfdet.enable(7)
        print(tfdet.profile().patches)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "keras_multi_worker" in result.stdout
