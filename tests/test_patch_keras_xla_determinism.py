"""`keras_xla_determinism`: Keras 3 keeps an explicit jit_compile=True, and
"auto" on a GPU machine, under op determinism where tfdet has a deterministic
XLA path, and only there."""

from __future__ import annotations

import json

from packaging.version import Version

from tests.conftest import REPO, run_python
from tfdet._pin import _versions

# Keras 3.7 added its own veto: no XLA under op determinism. Without tfdet's
# patch, older Keras keeps XLA whatever the model.
KERAS_VETOES_XLA = Version(_versions.distribution_version("keras")) >= Version("3.7")

CHILD = f"""
import json, sys, warnings
sys.path.insert(0, {str(REPO / "tests" / "targets")!r})
warnings.simplefilter("ignore")
import tfdet
patches = sys.argv[1:] if len(sys.argv) > 1 else "auto"
tfdet.enable(patches=None if patches == ["none"] else patches)
import keras
import xla_models

def dense(jit_compile):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model.jit_compile

print(json.dumps({{
    "explicit": dense(True),
    "auto": dense("auto"),
    "max_pool_2d": xla_models.jit_max_pool().jit_compile,
    "max_pool_3d": xla_models.jit_max_pool_3d().jit_compile,
}}))
"""


def _jit(*patches: str) -> dict:
    code = CHILD.replace(
        "sys.argv[1:] if len(sys.argv) > 1 else", f"{list(patches)!r} or"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_explicit_jit_is_kept_where_xla_is_deterministic_and_auto_is_left_to_keras():
    assert _jit() == {
        "explicit": True,
        "max_pool_2d": True,
        # MaxPool3DGrad has no deterministic XLA form: Keras's fallback stays.
        "max_pool_3d": False,
        # On a CPU-only machine Keras resolves "auto" to False anyway.
        "auto": False,
    }


def test_without_the_max_pool_patch_keras_drops_xla_as_before():
    # Only the Keras patch: a MaxPool model has no deterministic XLA gradient.
    assert _jit("keras_xla_determinism")["max_pool_2d"] is False
    assert _jit("keras_xla_determinism")["explicit"] is True
    # No patch at all: Keras's own answer under determinism.
    assert _jit("none")["explicit"] is not KERAS_VETOES_XLA


# Keras resolves "auto" by asking whether any non-CPU device exists; the child
# answers yes with a stand-in GPU (nothing runs, the models only compile).
AUTO_ON_GPU_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
import tfdet
tfdet.enable(patches=PATCHES)
import keras
import tensorflow as tf
from tensorflow.python.framework import config

class _Gpu:
    device_type = "GPU"
    name = "/physical_device:GPU:0"

listed = config.list_physical_devices
tf.config.list_physical_devices = lambda kind=None: (
    listed(kind) + ([_Gpu()] if kind in (None, "GPU") else [])
)

def auto(*layers, shape=(8, 8, 3)):
    model = keras.Sequential([keras.Input(shape), *layers, keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")  # jit_compile="auto"
    return model.jit_compile

print(json.dumps({
    "dense": auto(shape=(4,)),
    "max_pool_2d": auto(keras.layers.MaxPooling2D(2)),
    "max_pool_3d": auto(keras.layers.MaxPooling3D(2), shape=(4, 8, 8, 3)),
}))
"""


def _auto_on_gpu(patches) -> dict:
    result = run_python(AUTO_ON_GPU_CHILD.replace("PATCHES", repr(patches)))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_auto_means_xla_on_a_gpu_machine_where_it_is_deterministic():
    assert _auto_on_gpu("auto") == {
        "dense": True,
        "max_pool_2d": True,
        "max_pool_3d": False,
    }
    # Without tfdet's patches Keras 3.7+ vetoes XLA under determinism, GPU or
    # not; older Keras keeps it for every model.
    without = not KERAS_VETOES_XLA
    assert _auto_on_gpu(None) == {
        "dense": without,
        "max_pool_2d": without,
        "max_pool_3d": without,
    }
