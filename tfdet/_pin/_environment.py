"""The environment fingerprint: what `tfdet env` prints and traces record."""

from __future__ import annotations

import os
import platform
from typing import Any

from tfdet import _variables
from tfdet._cpuinfo import fields as _cpuinfo_fields
from tfdet._pin import _arm, _cpuid, _isa, _versions
from tfdet._pin._cpus import affinity
from tfdet._pin._profile import Profile
from tfdet._version import __version__

DETERMINISM_VARIABLES = (
    "PYTHONHASHSEED",
    "TF_ENABLE_ONEDNN_OPTS",
    "ONEDNN_MAX_CPU_ISA",
    # oneDNN's "fast math" (BF16 products in float32 models), which Graviton
    # guides recommend exporting: other bits wherever oneDNN honours it.
    "ONEDNN_DEFAULT_FPMATH_MODE",
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


_SYS_CPU = "/sys/devices/system/cpu"
# glibc's sysconf names, the fallback where /sys has no cache directory.
_SYSCONF_CACHES = (
    ("L1d", "SC_LEVEL1_DCACHE_SIZE"),
    ("L1i", "SC_LEVEL1_ICACHE_SIZE"),
    ("L2", "SC_LEVEL2_CACHE_SIZE"),
    ("L3", "SC_LEVEL3_CACHE_SIZE"),
    ("L4", "SC_LEVEL4_CACHE_SIZE"),
)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _cache_label(level: str, kind: str) -> str:
    suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
    return f"L{level}{suffix}"


def cpu_caches(root: str = _SYS_CPU) -> tuple[list[str], list[str]]:
    """The first CPU's caches, from sysfs, else from glibc's sysconf.

    Args:
        root: The sysfs CPU directory (a parameter for tests).

    Returns:
        `(sizes, sharing)`: sizes like `["L1d=32K", "L1i=32K", "L2=1024K",
        "L3=32768K"]` and, from sysfs only, which CPUs share each cache, like
        `["L1d:0", ..., "L3:0-1"]`. Both empty where neither source answers.
    """
    sizes: list[str] = []
    sharing: list[str] = []
    directory = os.path.join(root, "cpu0", "cache")
    try:
        entries = sorted(
            (name for name in os.listdir(directory) if name.startswith("index")),
            key=lambda name: int(name[5:]) if name[5:].isdigit() else 0,
        )
    except OSError:
        entries = []
    for entry in entries:
        path = os.path.join(directory, entry)
        level, kind, size = (
            _read(os.path.join(path, name)) for name in ("level", "type", "size")
        )
        if not level or not size:
            continue
        label = _cache_label(level, kind or "")
        sizes.append(f"{label}={size}")
        shared = _read(os.path.join(path, "shared_cpu_list"))
        if shared:
            sharing.append(f"{label}:{shared}")
    if sizes:
        return sizes, sharing
    for label, name in _SYSCONF_CACHES:
        try:
            value = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if value and value > 0:
            sizes.append(f"{label}={value // 1024}K")
    return sizes, sharing


def cpu_facts() -> dict[str, Any]:
    """The CPU facts that can decide bits, flat (`cpu_` keys), JSON-ready.

    Vendor, model name, family/model/stepping (the microarchitecture), cache
    sizes per level, logical CPUs, the ISA oneDNN may use (`cpu_isa_in_force`:
    the lower of `ONEDNN_MAX_CPU_ISA` and the best the CPU has) and the best
    it has. Missing facts (no /proc/cpuinfo, no sysfs) are None or empty.
    """
    fields = _cpuinfo_fields(
        ("vendor_id", "cpu family", "model", "stepping", "CPU implementer", "CPU part")
    )
    sizes, sharing = cpu_caches()
    if _arm.applies():
        return _arm_cpu_facts(fields, sizes, sharing)
    applies = _isa.applies()
    return {
        "cpu_vendor": fields.get("vendor_id")
        or fields.get("CPU implementer")
        or platform.processor()
        or None,
        "cpu_model": _isa.cpu_model(),
        "cpu_family": fields.get("cpu family"),
        "cpu_model_number": fields.get("model"),
        "cpu_stepping": fields.get("stepping"),
        "cpu_caches": sizes,
        "cpu_cache_sharing": sharing,
        "cpu_count": os.cpu_count(),
        "cpu_isa_flags": _isa.relevant_flags(),
        "cpu_isa_in_force": _isa.in_force() if applies else None,
        "cpu_isa_best": _isa.best_supported() if applies else None,
        # What CPUID tells this process (oneDNN and Eigen dispatch on it):
        # under an emulator, the emulated model, not /proc/cpuinfo's.
        "cpu_cpuid": _cpuid.describe(),
        "cpu_emulated": os.environ.get(_variables.EMULATED_CPU),
    }


def _arm_cpu_facts(
    fields: dict[str, str], sizes: list[str], sharing: list[str]
) -> dict[str, Any]:
    """`cpu_facts` on aarch64: the same keys, from what aarch64 tells.

    The vector unit oneDNN would use (`sve_512`, `sve_256`, `sve_128` or
    `asimd`) is the ISA in force: there is no cap to lower it. Under a
    user-mode emulator /proc/cpuinfo is the host's, so the vendor and model
    are the emulator's CPU (QEMU's `QEMU_CPU`, `max` unless set) and
    `cpu_emulated` names the host.
    """
    host = _arm.emulated_on(fields)
    named = _arm.describe({} if host else fields)
    isa = _arm.environment_isa()
    emulated_model = os.environ.get("QEMU_CPU", "max")
    return {
        "cpu_vendor": "QEMU (emulated)" if host else named["vendor"],
        "cpu_model": f"QEMU {emulated_model}" if host else named["model"],
        "cpu_family": None,
        "cpu_model_number": None,
        "cpu_stepping": None,
        "cpu_caches": sizes,
        "cpu_cache_sharing": sharing,
        "cpu_count": os.cpu_count(),
        "cpu_isa_flags": _arm.features(),
        "cpu_isa_in_force": isa,
        "cpu_isa_best": isa,
        "cpu_cpuid": None,
        "cpu_emulated": (
            f"aarch64 {emulated_model} under a user-mode emulator on {host}"
            if host
            else None
        ),
    }


# What each CPU fact does to the bits: (verdict, why). "yes": it changes the
# bits; "may": it changed them in a measurement, for some models; "no": it
# does not under a tfdet profile.
_MICROARCHITECTURE = (
    "may",
    "another microarchitecture or vendor: its approximate instructions "
    "(RSQRTPS, RCPPS) give other bits, which enable()'s portable patches keep "
    "out of Eigen's rsqrt, reciprocal, softmax and erfc; before them an AMD "
    "EPYC and an Intel Xeon trained BatchNorm and GELU models to other "
    "weights, under them to the same ones for every reference model, but a "
    "kernel outside that set may still differ",
)
CPU_FACT_EFFECTS: dict[str, tuple[str, str]] = {
    "cpu_emulated": (
        "may",
        "one process ran on an emulated CPU (QEMU's user mode, named by its "
        "model): another vendor's CPUID and cache sizes, and RSQRTPS/RCPPS "
        "computed exactly; an emulation, not that vendor's hardware",
    ),
    "cpu_cpuid": _MICROARCHITECTURE,
    "cpu_vendor": _MICROARCHITECTURE,
    "cpu_model": _MICROARCHITECTURE,
    "cpu_family": _MICROARCHITECTURE,
    "cpu_model_number": _MICROARCHITECTURE,
    "cpu_stepping": (
        "may",
        "another stepping of a microarchitecture: not measured; kernels that "
        "tune to the CPU model could differ",
    ),
    "cpu_caches": (
        "may",
        "Eigen and oneDNN size their blocks from the cache sizes the CPU "
        "reports; measured by writing an Intel Xeon's sizes (L1d 48K) into an "
        "AMD EPYC's (32K) process: Eigen's matrix products then add in "
        "another order (other bits for Conv2D models with oneDNN's custom ops "
        "off, and for mixed_bfloat16 with them on), oneDNN's float32 kernels "
        "did not; enable()'s eigen_cache_sizes patch pins Eigen's sizes",
    ),
    "cpu_cache_sharing": (
        "no",
        "which CPUs share a cache follows the core count; the blocking uses "
        "the sizes (compared separately)",
    ),
    "cpu_isa_in_force": (
        "yes",
        "oneDNN and Eigen pick their kernels, and so the order of "
        "floating-point operations, by the ISA in force",
    ),
    "cpu_isa_best": (
        "no",
        "only the ISA in force picks the kernels (compared separately); the "
        "cap pins it",
    ),
    "cpu_isa_flags": (
        "may",
        "TensorFlow turns its oneDNN custom ops on by default only on CPUs "
        "with AI extensions such as AVX512_VNNI, AVX512_BF16 or AMX (measured: "
        "on on an AVX-512 BF16 AMD EPYC, off on QEMU's AVX2 CPU models, with "
        "other weights), unless TF_ENABLE_ONEDNN_OPTS is set; compare "
        "onednn_custom_ops",
    ),
    "onednn_custom_ops": (
        "yes",
        "TensorFlow's oneDNN custom ops run other convolution, matmul and "
        "softmax kernels than Eigen's; set TF_ENABLE_ONEDNN_OPTS (or "
        "enable(onednn=...)) to pin it",
    ),
    "cpu_count": (
        "no",
        "bits follow the thread-pool size, pinned by enable(), not the core "
        "count (measured: pools of 1 and 2 gave the same bits, 3, 4, 8 and "
        "16 each other ones)",
    ),
}
_UNPINNED_POOLS = (
    "yes",
    "tfdet was not enabled in at least one run, so TensorFlow sized its thread "
    "pools from the core count, and bits follow the pool size",
)


def compare_cpus(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The CPU facts that differ between two fingerprints, and what each does.

    Works on `fingerprint()` dicts and on trace headers' fingerprints written
    before the CPU facts were recorded (a fact missing from either side is not
    compared: it cannot be told apart from an equal one).

    Args:
        a: A fingerprint (`fingerprint()`, `tfdet env --json`, a trace header).
        b: Another one.

    Returns:
        `{fact: {"a": value, "b": value, "changes_bits": "yes" | "may" | "no",
        "why": one sentence}}` for each differing fact in `CPU_FACT_EFFECTS`,
        in that order; empty when the CPUs look alike. `cpu_count` is "yes"
        when either fingerprint has no profile (tfdet not enabled: TensorFlow
        sizes its pools from the cores).
    """
    differences: dict[str, dict[str, Any]] = {}
    for fact, (verdict, why) in CPU_FACT_EFFECTS.items():
        if fact not in a or fact not in b or a[fact] == b[fact]:
            continue
        if fact == "cpu_count" and (
            a.get("profile") is None or b.get("profile") is None
        ):
            verdict, why = _UNPINNED_POOLS
        differences[fact] = {
            "a": a[fact],
            "b": b[fact],
            "changes_bits": verdict,
            "why": why,
        }
    return differences


def _tensorflow_facts() -> dict[str, Any]:
    import tensorflow as tf

    build = dict(tf.sysconfig.get_build_info())
    gpus = [device.name for device in tf.config.list_physical_devices("GPU")]
    return {
        "tensorflow": tf.__version__,
        "tensorflow_distribution": (_versions.tensorflow_distribution() or ("?",))[0],
        "cuda_build": bool(build.get("is_cuda_build", False)),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "gpus": gpus,
        "op_determinism": op_determinism_enabled(),
        "onednn_custom_ops": onednn_custom_ops(),
    }


def op_determinism_enabled() -> bool:
    """Whether `tf.config.experimental.enable_op_determinism()` is in force."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def onednn_custom_ops() -> bool | None:
    """Whether TensorFlow runs its oneDNN custom ops, as it decided at import.

    Unset `TF_ENABLE_ONEDNN_OPTS` leaves the choice to TensorFlow, which
    depends on the CPU's extensions; None where TensorFlow cannot say.
    """
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # pragma: no cover - other TF builds
        return None


def fingerprint(
    profile: Profile | None = None, include_tensorflow: bool = True
) -> dict[str, Any]:
    """The machine and software facts that can explain a difference in bits.

    Args:
        profile: The profile `enable()` put in force in this process
            (`tfdet.profile()`), recorded with the facts; None when tfdet is
            not enabled.
        include_tensorflow: Import TensorFlow to report its build and GPUs.

    Returns:
        A JSON-ready dict.
    """
    facts: dict[str, Any] = {
        "tfdet": __version__,
        "python": _versions.python_version(),
        "numpy": _versions.numpy_version(),
        "keras": _versions.keras_flavor(),
        "keras_version": _versions.keras_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        **cpu_facts(),
        "affinity": affinity(),
        "env": {name: os.environ.get(name) for name in DETERMINISM_VARIABLES},
    }
    if include_tensorflow:
        facts.update(_tensorflow_facts())
    facts["profile"] = None if profile is None else profile.to_dict()
    return facts
