"""Perturbations that make a run look like it is on another machine.

Each run of `tfdet check` gets a `RunSetup`: run 0 is the baseline (all the
CPUs this process may use, no ISA cap preset, ...), every other run differs in
each selected perturbation. FACTS.md and our own measurements: core count
(through TensorFlow's default thread pools) and the oneDNN ISA change the bits
when they are not pinned; the hash seed, a busy neighbour and a staggered start
must not change them at all.
"""

from __future__ import annotations

import dataclasses

from tfdet._pin import _isa
from tfdet._pin._environment import affinity

AFFINITY = "affinity"
ISA = "isa"
HASHSEED = "hashseed"
NEIGHBOUR = "neighbour"
STAGGER = "stagger"
ALL = (AFFINITY, ISA, HASHSEED, NEIGHBOUR, STAGGER)

DESCRIPTIONS = {
    AFFINITY: "a different CPU affinity (core count)",
    ISA: "a different ONEDNN_MAX_CPU_ISA preset (another x86 CPU generation)",
    HASHSEED: "a different PYTHONHASHSEED",
    NEIGHBOUR: "a CPU-burning neighbour process during the run",
    STAGGER: "a staggered start",
}

STAGGER_SECONDS = 0.75


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """How one run is made to look like another machine.

    Attributes:
        index: Run number; 0 is the baseline.
        env: Variables to set (None: unset) on top of the parent's environment.
        cpus: CPU affinity, or None for the parent's.
        delay: Seconds to wait before starting.
        neighbour: Whether a CPU-burning process runs alongside.
        labels: `{perturbation: what this run had}`, for the report.
    """

    index: int
    env: dict[str, str | None]
    cpus: tuple[int, ...] | None
    delay: float
    neighbour: bool
    labels: dict[str, str]

    def with_perturbation_of(
        self, other: RunSetup, name: str | None, index: int
    ) -> RunSetup:
        """This setup with perturbation `name` taken from `other` (None: none).

        Used to find which perturbation separates two runs: the baseline with
        one of the other run's perturbations at a time.
        """
        env = dict(self.env)
        labels = dict(self.labels)
        cpus, delay, neighbour = self.cpus, self.delay, self.neighbour
        if name is not None:
            for key in _ENV_KEYS.get(name, ()):
                env[key] = other.env.get(key)
            if name in other.labels:
                labels[name] = other.labels[name]
            if name == AFFINITY:
                cpus = other.cpus
            elif name == NEIGHBOUR:
                neighbour = other.neighbour
            elif name == STAGGER:
                delay = other.delay
        return RunSetup(index, env, cpus, delay, neighbour, labels)


_ENV_KEYS = {ISA: (_isa.ENV_VAR,), HASHSEED: ("PYTHONHASHSEED",)}


def applicable(pinned_isa: str | None = "AVX2") -> dict[str, str | None]:
    """`{perturbation: None if it applies here, else the reason it doesn't}`."""
    cpus = affinity()
    reasons: dict[str, str | None] = dict.fromkeys(ALL)
    if cpus is None:
        reasons[AFFINITY] = "CPU affinity is not available on this platform"
    elif len(cpus) < 2:
        reasons[AFFINITY] = "only one CPU is available"
    if not _isa.applies():
        reasons[ISA] = "oneDNN ISA caps only exist on x86-64"
    elif _isa.rank(_isa.best_supported()) <= _isa.rank(pinned_isa or "AVX2"):
        reasons[ISA] = f"this CPU has nothing above {pinned_isa or 'AVX2'} to cap"
    return reasons


def parse(text: str | None) -> list[str]:
    """Names from a comma-separated `--perturb` value ("all", "none").

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if text is None or text.strip() == "all":
        return list(ALL)
    if text.strip() in ("", "none"):
        return []
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in ALL]
    if unknown:
        raise ValueError(
            f"Expected --perturb names from {', '.join(ALL)} (or all, none). "
            f"Received: {', '.join(unknown)}"
        )
    return names


def plan(
    runs: int, names: list[str], pinned_isa: str | None = "AVX2"
) -> list[RunSetup]:
    """One `RunSetup` per run, each non-baseline run perturbed in every name.

    Perturbations that do not apply on this machine are left out (see
    `applicable`).
    """
    reasons = applicable(pinned_isa)
    active = [name for name in names if reasons[name] is None]
    cpus = affinity() or []
    best = _isa.best_supported() if _isa.applies() else None
    caps = [
        name
        for name in _isa.NAMES[:-1]
        if _isa.rank(pinned_isa or "AVX2")
        <= _isa.rank(name)
        < _isa.rank(best or "SSE41")
    ]
    setups = []
    for index in range(runs):
        env: dict[str, str | None] = {}
        labels: dict[str, str] = {}
        run_cpus: tuple[int, ...] | None = None
        delay, neighbour = 0.0, False
        if AFFINITY in active:
            count = len(cpus) if index == 0 else max(1, len(cpus) - index)
            # Rotate which CPUs a smaller set gets, so runs do not share one.
            run_cpus = tuple(cpus[(index + k) % len(cpus)] for k in range(count))
            labels[AFFINITY] = f"{count} CPU{'s' if count > 1 else ''} {list(run_cpus)}"
        if ISA in active:
            if index == 0:
                env[_isa.ENV_VAR] = None
                labels[ISA] = f"no cap preset (CPU best: {best})"
            else:
                cap = caps[(index - 1) % len(caps)]
                env[_isa.ENV_VAR] = cap
                labels[ISA] = f"{_isa.ENV_VAR}={cap} preset"
        if HASHSEED in active:
            env["PYTHONHASHSEED"] = str(1 + index * 7919)
            labels[HASHSEED] = f"PYTHONHASHSEED={env['PYTHONHASHSEED']}"
        if NEIGHBOUR in active:
            neighbour = index == runs - 1 and index > 0
            labels[NEIGHBOUR] = "CPU-burning neighbour" if neighbour else "no neighbour"
        if STAGGER in active:
            delay = index * STAGGER_SECONDS
            labels[STAGGER] = f"started +{delay:.2f}s"
        setups.append(RunSetup(index, env, run_cpus, delay, neighbour, labels))
    return setups


def skipped(names: list[str], pinned_isa: str | None = "AVX2") -> dict[str, str]:
    """`{name: reason}` for requested perturbations that do not apply here."""
    reasons = applicable(pinned_isa)
    return {name: reasons[name] for name in names if reasons[name] is not None}
