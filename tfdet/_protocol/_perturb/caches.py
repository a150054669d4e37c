"""`caches`: another real CPU's cache sizes, where Eigen and oneDNN read them."""

from __future__ import annotations

from tfdet import _variables
from tfdet._pin import _cache_sizes
from tfdet._protocol._perturb._records import Change, Context, Perturbation

CACHES = "caches"


def _change(index: int, context: Context) -> Change:
    if index == 0:
        return Change("this CPU's cache sizes", env={_variables.IMITATE_CACHES: None})
    geometries = _cache_sizes.others()
    geometry = geometries[(index - 1) % len(geometries)]
    return Change(
        f"cache sizes of an {geometry.describe()}, imitated in Eigen's and "
        "oneDNN's CPUID results",
        env={_variables.IMITATE_CACHES: geometry.to_env()},
        by_child=True,
    )


def _in_child() -> str | None:
    done = _cache_sizes.imitate_if_requested()
    return "; ".join(done) if done else None


PERTURBATION = Perturbation(
    name=CACHES,
    description="another real CPU's cache sizes, as Eigen and oneDNN "
    "read them (an imitation: the caches themselves are unchanged)",
    imitates="Another real CPU's cache sizes, one with another L1d "
    "first (e.g. an Intel Xeon's L1d 48K, L2 2M on an AMD EPYC Zen 4, "
    "a Zen 4's 32K on a Zen 5), written where Eigen and oneDNN keep "
    "what CPUID reported: Eigen's L1 size decides how its matrix "
    "products split their sums (enable() pins Eigen's sizes, so there "
    "it shows oneDNN's). The caches themselves, and code elsewhere "
    "that reads CPUID, are unchanged.",
    unavailable=lambda context: _cache_sizes.imitation_unavailable(),
    change=_change,
    in_child=_in_child,
)
