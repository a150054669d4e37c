"""Whether TensorFlow can see a GPU, answered cheaply when it cannot.

Importing TensorFlow costs seconds; on a machine without GPU device nodes or
with GPUs hidden by `CUDA_VISIBLE_DEVICES`, the answer is known without it.
"""

from __future__ import annotations

import glob
import os


def _hidden_by_env() -> bool:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip() in ("", "-1")


def _device_nodes() -> list[str]:
    return (
        glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/dxg") + glob.glob("/dev/kfd")
    )


def gpu_visible() -> bool:
    """Whether TensorFlow in this process lists at least one GPU."""
    if _hidden_by_env() or not _device_nodes():
        return False
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def why_no_gpu() -> str:
    """A short reason for `gpu_visible() == False`."""
    if _hidden_by_env():
        return "CUDA_VISIBLE_DEVICES hides every GPU"
    if not _device_nodes():
        return "no GPU device nodes on this machine"
    try:
        import tensorflow as tf

        build = tf.sysconfig.get_build_info()
    except ImportError:  # pragma: no cover
        return "TensorFlow is not installed"
    if not build.get("is_cuda_build", False):
        return "this TensorFlow build has no CUDA support (e.g. tensorflow-cpu)"
    return "TensorFlow lists no GPU"


def require_gpu() -> None:
    """Raises `DeviceUnavailableError` (exit 4) when TensorFlow lists no GPU:
    what `device="gpu"` of a command says on a machine without one."""
    from tfdet._errors import DeviceUnavailableError

    if not gpu_visible():
        raise DeviceUnavailableError(
            "Expected a GPU for `device=gpu`. Received: no GPU visible to TensorFlow "
            f"({why_no_gpu()}). Use `device=cpu`, or run on a machine with a "
            "GPU and the tensorflow[and-cuda] build."
        )


def hide_gpus() -> None:
    """Makes TensorFlow in this process CPU-only; call before its first op.

    Used where tfdet only inspects a model on the host: the check parent's
    preflight (TensorFlow would otherwise claim the GPU's memory while the
    GPU runs start) and `tfdet scan` (whose warm-up step would raise at the
    first op refused on GPU instead of letting the scan list it).

    Raises:
        RuntimeError: GPUs are visible and TensorFlow's runtime already
            started, so they can no longer be hidden.
    """
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError as error:  # The runtime started before us.
        if tf.config.get_visible_devices("GPU"):
            raise RuntimeError(
                "tfdet inspects models on the CPU, but TensorFlow's runtime already "
                "started with a GPU visible. Run it in a fresh process, or with "
                "CUDA_VISIBLE_DEVICES=-1."
            ) from error
