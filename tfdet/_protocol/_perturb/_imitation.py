"""What a check's runs stand for, and what no run on one machine can.

The report's `imitated`, `varied`, `emulated` and `not_imitated` sections
(`imitation_sections`) and the reference page (`docs/generate.py`) both say
these sentences: each record's `imitates`, `NOT_IMITATED` and `NOT_EMULATED`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdet._protocol import _emulation
from tfdet._protocol._perturb._registry import IMITATED, REGISTRY
from tfdet._protocol._perturb.emulated_cpu import EMULATED_CPU

_NOT_EMULATED = (
    " Not run here: `--perturb emulated_cpu` runs one process on an emulated "
    "CPU of the other vendor (QEMU user mode: " + _emulation.INSTALL + ")."
)
NOT_IMITATED = {
    "cpu_vendor": "The CPU vendor: an AMD and an Intel CPU run different "
    "microcode and, in oneDNN and Eigen, sometimes different code paths; "
    "before enable()'s portable patches they gave BatchNorm/GELU/Adam models "
    "different weights." + _NOT_EMULATED,
    "approximate_instructions": "The CPU's own results for approximate "
    "instructions (RSQRTPS, RCPPS), which are implementation-specific: Eigen "
    "starts rsqrt, reciprocal, erfc (exact GELU) and softmax from them. "
    "enable()'s portable_* patches replace those four ops with correctly "
    "rounded ones (equal natively and under QEMU); any other kernel that uses "
    "them is not covered." + _NOT_EMULATED,
    "microarchitecture": "The CPU microarchitecture (family, model, stepping): "
    "oneDNN tunes blocking and kernels to it, and one machine cannot run "
    "another's.",
    "cache_sizes_elsewhere": "The cache sizes as code other than Eigen's and oneDNN's "
    "cached CPUID results sees them (any, where the caches perturbation does "
    "not apply): an affinity mask does not change what the CPU reports.",
    "isa_above_this_cpu": "An ISA this CPU lacks: a cap can only lower the "
    "ISA, so a newer generation (e.g. AVX-512 or AMX on an AVX2 machine) "
    "cannot be imitated.",
    "software": "Other TensorFlow, Keras, NumPy, oneDNN or Python versions, "
    "or another TensorFlow build: every run uses this interpreter.",
    "gpu_model": "Another GPU model, driver, CUDA or cuDNN version.",
    "operating_system": "Another OS, C library or libm: every run shares this "
    "machine's.",
}


# What an emulated run still does not stand for (replacing the two entries
# of NOT_IMITATED that it covers).
NOT_EMULATED = {
    "vendor_hardware": "Intel's and AMD's own hardware: the emulated run showed "
    "another vendor's CPUID-driven dispatch and cache sizes and exact results "
    "of RSQRTPS/RCPPS, not a vendor's own approximation tables, AVX-512/AMX "
    "paths or real cache behaviour.",
}


def imitation_sections(
    applied: Sequence[str], emulated_model: str | None
) -> dict[str, Any]:
    """The report's `imitated`, `varied`, `emulated` and `not_imitated` sections.

    Args:
        applied: The perturbations that ran on some device.
        emulated_model: The `emulated_cpu` model asked for (None: default).
    """
    emulated = {}
    if EMULATED_CPU in applied:
        model = emulated_model or _emulation.default_model()
        emulated[EMULATED_CPU] = (
            f"{_emulation.describe(model)}: {REGISTRY[EMULATED_CPU].imitates}"
        )
        not_imitated = {
            name: text
            for name, text in NOT_IMITATED.items()
            if name not in ("cpu_vendor", "approximate_instructions")
        }
        not_imitated.update(NOT_EMULATED)
    else:
        not_imitated = dict(NOT_IMITATED)
    machines = [name for name in applied if name != EMULATED_CPU]
    return {
        "imitated": {
            name: IMITATED[name] for name in machines if REGISTRY[name].other_machine
        },
        "varied": {
            name: IMITATED[name]
            for name in machines
            if not REGISTRY[name].other_machine
        },
        "emulated": emulated,
        "not_imitated": not_imitated,
    }
