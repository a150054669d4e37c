"""The environment fingerprint: what `tfdet env` prints and traces record."""

from __future__ import annotations

import os
import platform
from typing import Any

from tfdet._pin import _isa, _versions

DETERMINISM_VARIABLES = (
    "PYTHONHASHSEED",
    "TF_ENABLE_ONEDNN_OPTS",
    "ONEDNN_MAX_CPU_ISA",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "OMP_NUM_THREADS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_CUDNN_USE_AUTOTUNE",
    "TF_DETERMINISTIC_ORDER",
    "TF_DISABLE_SCATTER_OP_DETERMINISM",
    "TF_USE_LEGACY_KERAS",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
    "CUDA_VISIBLE_DEVICES",
    "KERAS_BACKEND",
)


def affinity() -> list[int] | None:
    """The CPUs this process may run on, or None where the OS cannot say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _tensorflow_facts() -> dict[str, Any]:
    import tensorflow as tf

    from tfdet._pin import _enable

    build = dict(tf.sysconfig.get_build_info())
    gpus = [device.name for device in tf.config.list_physical_devices("GPU")]
    return {
        "tensorflow": tf.__version__,
        "tensorflow_distribution": (_versions.tensorflow_distribution() or ("?",))[0],
        "cuda_build": bool(build.get("is_cuda_build", False)),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "gpus": gpus,
        "op_determinism": _enable.op_determinism_enabled(),
    }


def fingerprint(include_tensorflow: bool = True) -> dict[str, Any]:
    """The machine and software facts that can explain a difference in bits.

    Args:
        include_tensorflow: Import TensorFlow to report its build and GPUs.

    Returns:
        A JSON-ready dict.
    """
    from tfdet import __version__
    from tfdet._pin._enable import profile

    facts: dict[str, Any] = {
        "tfdet": __version__,
        "python": _versions.python_version(),
        "numpy": _versions.numpy_version(),
        "keras": _versions.keras_flavor(),
        "keras_version": _versions.keras_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _isa.cpu_model(),
        "cpu_isa_flags": _isa.relevant_flags(),
        "cpu_isa_best": _isa.best_supported() if _isa.applies() else None,
        "cpu_count": os.cpu_count(),
        "affinity": affinity(),
        "env": {name: os.environ.get(name) for name in DETERMINISM_VARIABLES},
    }
    if include_tensorflow:
        facts.update(_tensorflow_facts())
    active = profile()
    facts["profile"] = None if active is None else active.to_dict()
    return facts
