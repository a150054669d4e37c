"""`emulated_cpu` (opt-in): one run on another CPU model, emulated by QEMU.

On x86-64, another vendor's x86 CPU; on aarch64, another ARM core (another
vector unit: NEON or 512-bit SVE).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tfdet import _variables
from tfdet._pin import _arm, _cpuid, _environment
from tfdet._protocol import _emulation
from tfdet._protocol._perturb._records import Change, Context, Perturbation
from tfdet._protocol._perturb.caches import CACHES

EMULATED_CPU = "emulated_cpu"


def _model(context: Context) -> str:
    return context.emulated_model or _emulation.default_model()


def _change(index: int, context: Context) -> Change:
    if index == 0:
        return Change("native (this CPU)")
    model = _model(context)
    return Change(
        f"{_emulation.describe(model)} (an emulation, not real hardware; "
        f"allowed {_emulation.SLOWDOWN:g}x `timeout`, as emulation is that much "
        "slower)",
        env={_variables.EMULATED_CPU: model, **_emulation.environment(model)},
        by_child=True,
        launcher=_emulation.launcher(model),
        slowdown=_emulation.SLOWDOWN,
    )


def _in_child() -> str | None:
    """What CPUID tells the process, when it was to run emulated."""
    model = os.environ.get(_variables.EMULATED_CPU)
    if not model:
        return None
    if _arm.applies():
        return _arm_in_child(model)
    seen = _cpuid.describe()
    native = _cpuid_of_this_machine()
    if seen is None or seen == native:
        return None  # Not emulated after all: the run fails, unreported.
    return f"CPUID: {seen} ({model}; this machine: {native})"


def _arm_in_child(model: str) -> str | None:
    """The vector unit the process sees, when it is the model's (ARM cores
    have no CPUID a process may read; their features tell the unit apart)."""
    seen = _arm.environment_isa()
    expected = _emulation.model_isa(model)
    if expected is not None and seen != expected:
        return None  # Not on that model after all: the run fails, unreported.
    return f"vector unit {seen} ({model}, emulated)"


def _cpuid_of_this_machine() -> str:
    facts = _environment.cpu_facts()
    return (
        f"{facts.get('cpu_vendor')} family {facts.get('cpu_family')} model "
        f"{facts.get('cpu_model_number')}"
    )


def _supersedes(change: Change) -> Mapping[str, Change]:
    if not change.launcher:
        return {}
    # The emulated CPU reports its own cache sizes through CPUID.
    return {CACHES: Change("the emulated CPU's own cache sizes (its CPUID)")}


PERTURBATION = Perturbation(
    name=EMULATED_CPU,
    description="one run on an emulated CPU: another vendor's x86, or on "
    "aarch64 another ARM core (QEMU user mode, --emulate-cpu MODEL; opt-in: "
    "5-10x slower)",
    imitates="Another x86 implementation, emulated: QEMU's CPU model "
    "reports another vendor, family, model and cache sizes through "
    "CPUID (oneDNN and Eigen dispatch and block on them), and its code "
    "generator computes the approximate instructions (RSQRTPS, RCPPS) "
    "exactly where AMD and Intel each approximate their own way. Not "
    "Intel's or AMD's own tables, AVX-512/AMX paths, or real caches. On "
    "aarch64, another ARM core's vector unit (QEMU's neoverse-n1: NEON; max, "
    "a64fx: 512-bit SVE), which oneDNN's and Eigen's kernels follow.",
    # An emulated run is 5-10x slower: a check would take minutes.
    default=False,
    unavailable=lambda context: context.not_emulated,
    change=_change,
    in_child=_in_child,
    supersedes=_supersedes,
)
