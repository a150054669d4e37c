"""`affinity`: fewer CPUs in a run's affinity mask (another core count)."""

from __future__ import annotations

from tfdet._pin._cpus import affinity
from tfdet._protocol._perturb._records import Change, Context, Perturbation

AFFINITY = "affinity"


def _unavailable(context: Context) -> str | None:
    cpus = affinity()
    if cpus is None:
        return "CPU affinity is not available on this platform"
    if len(cpus) < 2:
        return "only one CPU is available"
    return None


def _change(index: int, context: Context) -> Change:
    cpus = affinity() or []
    count = len(cpus) if index == 0 else max(1, len(cpus) - index)
    # Rotate which CPUs a smaller set gets, so runs do not share one.
    chosen = tuple(cpus[(index + k) % len(cpus)] for k in range(count))
    return Change(f"{count} CPU{'s' if count > 1 else ''} {list(chosen)}", cpus=chosen)


PERTURBATION = Perturbation(
    name=AFFINITY,
    description="a different CPU affinity (core count)",
    imitates="Fewer CPUs in the affinity mask: another core count, which "
    "sizes TensorFlow's default thread pools and enable()'s (the CPUs the "
    "process may use, unless --threads pins a size).",
    unavailable=_unavailable,
    change=_change,
)
