"""`isa`: a lower oneDNN ISA cap preset (an older x86 CPU generation)."""

from __future__ import annotations

import os

from tfdet._pin import _isa
from tfdet._protocol._perturb._records import Change, Context, Perturbation

ISA = "isa"


def _presets(pinned_isa: str | None) -> list[str]:
    """Presets that change the ISA in force here: below this CPU's best.

    Empty under a pinned cap: a preset above the cap is overridden by it (no
    change at all), one below it is kept by enable() and becomes the profile's
    cap (a different profile, not another machine). So with the cap pinned no
    preset imitates another CPU generation.
    """
    if pinned_isa is not None or not _isa.applies():
        return []
    best = _isa.best_supported()
    # AVX2 first: the most common older generation still in service.
    return [
        name
        for name in _isa.NAMES[:-1]
        if _isa.rank("AVX2") <= _isa.rank(name) < _isa.rank(best)
    ]


def _unavailable(context: Context) -> str | None:
    if not _isa.applies():
        return "oneDNN ISA caps only exist on x86-64"
    if context.pinned_isa is not None:
        return (
            f"not applicable: the profile pins {_isa.ONEDNN_ISA_VARIABLE}={context.pinned_isa}, "
            "so a preset above it is overridden and one below it is a different "
            "profile; no preset imitates another CPU generation"
        )
    if not _presets(None):
        return f"this CPU has nothing above AVX2 to cap ({_isa.best_supported()})"
    return None


def _change(index: int, context: Context) -> Change:
    best = _isa.best_supported()
    # XLA:CPU gets the same cap as oneDNN, as enable() gives it.
    xla_flags = os.environ.get("XLA_FLAGS")
    if index == 0:
        return Change(
            f"no cap preset (CPU best: {best})",
            env={_isa.ONEDNN_ISA_VARIABLE: None, "XLA_FLAGS": xla_flags},
        )
    caps = _presets(context.pinned_isa)
    cap = caps[(index - 1) % len(caps)]
    return Change(
        f"{_isa.ONEDNN_ISA_VARIABLE}={cap} preset, XLA:CPU capped alike (below this CPU's "
        f"{best}: the kernels of an older CPU generation)",
        env={
            _isa.ONEDNN_ISA_VARIABLE: cap,
            "XLA_FLAGS": _isa.with_xla_cap(xla_flags or "", cap),
        },
    )


PERTURBATION = Perturbation(
    name=ISA,
    description="a lower ONEDNN_MAX_CPU_ISA preset (an older x86 CPU "
    "generation); only without a pinned cap (--no-enable or "
    "cpu_isa=None)",
    imitates="A lower oneDNN ISA cap: the kernels an older x86 CPU "
    "generation would run, when no cap is pinned.",
    unavailable=_unavailable,
    change=_change,
)
