"""Perturbations that make a run look like it is on another machine.

Each run of `tfdet check` gets a `RunSetup`: run 0 is the baseline (all the
CPUs this process may use, no ISA cap preset, ...), every other run differs in
each selected perturbation. Core count (through TensorFlow's default thread
pools), the oneDNN ISA and the cache sizes Eigen blocks its products by
change the bits when they are not pinned; the hash seed, a busy neighbour and
a staggered start must not change them at all.

These are imitations on one machine. `IMITATED` and `NOT_IMITATED` say what a
check can and cannot stand for: measured, two real machines (an AMD EPYC and
an Intel Xeon) under the same profile gave different weights for some models
that `check` reported identical on each of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from tfdet._pin import _cache_sizes, _isa
from tfdet._pin._environment import affinity

AFFINITY = "affinity"
ISA = "isa"
HASHSEED = "hashseed"
NEIGHBOUR = "neighbour"
STAGGER = "stagger"
THREADS = "threads"
CACHES = "caches"
# The default set ("all"): what must not change the bits under one profile.
ALL = (AFFINITY, ISA, CACHES, HASHSEED, NEIGHBOUR, STAGGER)
# Named explicitly only: under `enable()` another pool size is another
# profile, and bits follow the pool size (measured: pools of 1 and 2 gave the
# same bits on a CNN, 3, 4, 8 and 16 each other ones), so in the default set
# it would make the check fail by design.
OPT_IN = (THREADS,)
KNOWN = ALL + OPT_IN
NONE = "none"

DESCRIPTIONS = {
    AFFINITY: "a different CPU affinity (core count)",
    ISA: "a lower ONEDNN_MAX_CPU_ISA preset (an older x86 CPU generation); "
    "only without a pinned cap (--no-enable or cpu_isa=None)",
    CACHES: "another real CPU's cache sizes, as Eigen and oneDNN read them "
    "(an imitation: the caches themselves are unchanged)",
    HASHSEED: "a different PYTHONHASHSEED",
    NEIGHBOUR: "a CPU-burning neighbour process during the run",
    STAGGER: "a staggered start",
    THREADS: "another thread-pool size (not in 'all': a different setting, not "
    "another machine; shows whether the bits follow the pool size)",
}

# What `check` imitates, and what it does not: one sentence each, for the
# report and `--json`.
IMITATED = {
    AFFINITY: "Fewer CPUs in the affinity mask: what another core count does "
    "to TensorFlow's default thread pools (pinned by enable(), so it matters "
    "only without tfdet).",
    ISA: "A lower oneDNN ISA cap: the kernels an older x86 CPU generation "
    "would run, when no cap is pinned.",
    CACHES: "Another real CPU's cache sizes (e.g. an Intel Xeon's L1d 48K, L2 "
    "2M on an AMD EPYC), written where Eigen and oneDNN keep what CPUID "
    "reported: Eigen's L1 size decides how its matrix products split their "
    "sums (enable() pins Eigen's sizes, so there it shows oneDNN's). The "
    "caches themselves, and code elsewhere that reads CPUID, are unchanged.",
    HASHSEED: "Another PYTHONHASHSEED: another set and dict iteration order.",
    NEIGHBOUR: "A process burning one core: another machine's load and scheduling.",
    STAGGER: "Staggered starts: runs that do not start or reach each step together.",
    THREADS: "Another thread-pool size (opt-in): a different setting on the "
    "same CPU, not another machine.",
}
NOT_IMITATED = {
    "cpu_vendor": "The CPU vendor: an AMD and an Intel CPU run different "
    "microcode and, in oneDNN and Eigen, sometimes different code paths; "
    "measured, they gave different weights for BatchNorm/GELU/Adam models.",
    "approximate_instructions": "The CPU's own results for approximate "
    "instructions (RSQRTPS, RCPPS), which are implementation-specific: Eigen "
    "starts rsqrt, reciprocal, erfc (exact GELU) and softmax from them. "
    "enable()'s portable_* patches replace those four ops with correctly "
    "rounded ones (equal natively and under QEMU); any other kernel that uses "
    "them is not covered.",
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
        threads: Thread-pool size this run's `enable()` pins instead of the
            profile's (None: the profile's); the spawner puts it in the worker
            spec.
        worker: Task index of this process in a multi-worker run (see
            `workers_of`), or None for a run of one process.
    """

    index: int
    env: dict[str, str | None]
    cpus: tuple[int, ...] | None
    delay: float
    neighbour: bool
    labels: dict[str, str]
    threads: int | None = None
    worker: int | None = None

    @property
    def name(self) -> str:
        """`run 2`, or `run 2 worker 1` for one process of a multi-worker run."""
        suffix = "" if self.worker is None else f" worker {self.worker}"
        return f"run {self.index}{suffix}"

    @property
    def file_stem(self) -> str:
        """`run2` or `run2-worker1`: the stem of this process's files."""
        suffix = "" if self.worker is None else f"-worker{self.worker}"
        return f"run{self.index}{suffix}"

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
        threads = self.threads
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
            elif name == THREADS:
                threads = other.threads
        return RunSetup(index, env, cpus, delay, neighbour, labels, threads)


# TensorFlow reads these when it starts: they set the pool size for a run
# without tfdet (with tfdet, `RunSetup.threads` reaches enable()).
_THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
_ENV_KEYS = {
    ISA: (_isa.ENV_VAR, "XLA_FLAGS"),
    CACHES: (_cache_sizes.ENV_VAR,),
    HASHSEED: ("PYTHONHASHSEED",),
    THREADS: _THREAD_VARIABLES,
}
# enable()'s default pool size.
DEFAULT_THREADS = 1


def pinned_cap(options: Any) -> str | None:
    """The ISA cap a check's or locate's runs pin: None with `enable=False`.

    Args:
        options: Anything with `enable` and `cpu_isa` (`CheckOptions`,
            `LocateOptions`).
    """
    return options.cpu_isa if options.enable else None


def _pinned(pinned_isa: str | None) -> str | None:
    """The cap a profile pins, canonical; None when nothing is pinned."""
    if pinned_isa is None or not _isa.applies():
        return None
    cap = _isa.normalize(pinned_isa)
    return None if cap == "ALL" else cap


def _isa_presets(pinned_isa: str | None) -> list[str]:
    """Presets that change the ISA in force here: below this CPU's best.

    Empty under a pinned cap: a preset above the cap is overridden by it (no
    change at all), one below it is kept by enable() and becomes the profile's
    cap (a different profile, not another machine). So with the cap pinned no
    preset imitates another CPU generation.
    """
    if _pinned(pinned_isa) is not None or not _isa.applies():
        return []
    best = _isa.best_supported()
    # AVX2 first: the most common older generation still in service.
    return [
        name
        for name in _isa.NAMES[:-1]
        if _isa.rank("AVX2") <= _isa.rank(name) < _isa.rank(best)
    ]


def other_pool_size(threads: int | None) -> int:
    """The pool size the other runs of a `threads` perturbation get.

    3 against a baseline of 1 or 2 (measured: pools of 1 and 2 can give the
    same bits, 3 gave other ones), 1 against any larger baseline.
    """
    return 3 if (threads or DEFAULT_THREADS) < 3 else 1


def applicable(pinned_isa: str | None = "AVX2") -> dict[str, str | None]:
    """`{perturbation: None if it applies here, else the reason it doesn't}`.

    Args:
        pinned_isa: The ISA cap the runs' profile pins (`enable(cpu_isa=...)`);
            None (or "ALL") when nothing is pinned, as with `--no-enable`.
    """
    cpus = affinity()
    reasons: dict[str, str | None] = dict.fromkeys(KNOWN)
    if cpus is None:
        reasons[AFFINITY] = "CPU affinity is not available on this platform"
    elif len(cpus) < 2:
        reasons[AFFINITY] = "only one CPU is available"
    pinned = _pinned(pinned_isa)
    if not _isa.applies():
        reasons[ISA] = "oneDNN ISA caps only exist on x86-64"
    elif pinned is not None:
        reasons[ISA] = (
            f"not applicable: the profile pins {_isa.ENV_VAR}={pinned}, so a "
            "preset above it is overridden and one below it is a different "
            "profile; no preset imitates another CPU generation"
        )
    elif not _isa_presets(None):
        reasons[ISA] = (
            f"this CPU has nothing above AVX2 to cap ({_isa.best_supported()})"
        )
    reasons[CACHES] = _cache_sizes.imitation_unavailable()
    return reasons


def _duplicates(names: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({name for name in names if name in seen or seen.add(name)})


def validate(names: Sequence[str]) -> list[str]:
    """Checks a sequence of perturbation names (empty: none); returns a list.

    Raises:
        ValueError: an unknown or repeated name, listing the known ones.
    """
    names = list(names)
    unknown = [name for name in names if name not in KNOWN]
    if unknown:
        raise ValueError(
            f"Expected --perturb names from {', '.join(KNOWN)} (or all, none). "
            f"Received: --perturb={','.join(names)} (unknown: {', '.join(unknown)})"
        )
    repeated = _duplicates(names)
    if repeated:
        raise ValueError(
            "Expected each --perturb name once. Received: "
            f"--perturb={','.join(names)} ({', '.join(repeated)} repeated). "
            "Name each perturbation once."
        )
    return names


def parse(text: str | None) -> list[str]:
    """Names from a comma-separated `--perturb` value.

    None or "all": the default set `ALL` (not `threads`, which is opt-in);
    "none": no perturbation (identical processes); otherwise names from
    `KNOWN`, each once, e.g. "affinity,threads".

    Raises:
        ValueError: an empty value or name, an unknown or repeated name, or
            "all"/"none" mixed with other names; the message names the flag
            and says what to pass.
    """
    if text is None or text.strip() == "all":
        return list(ALL)
    if text.strip() == NONE:
        return []
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or "" in parts:
        raise ValueError(
            "Expected --perturb to be all, none or comma-separated names from "
            f"{', '.join(KNOWN)}. Received: --perturb={text!r} (an empty name). "
            "Pass --perturb none for identical processes."
        )
    special = [part for part in parts if part in ("all", NONE)]
    if special:
        raise ValueError(
            f"Expected '{special[0]}' alone in --perturb. Received: "
            f"--perturb={text!r}. Pass either '{special[0]}' or a list of names."
        )
    return validate(parts)


def plan(
    runs: int,
    names: list[str],
    pinned_isa: str | None = "AVX2",
    threads: int | None = None,
) -> list[RunSetup]:
    """One `RunSetup` per run, each non-baseline run perturbed in every name.

    Perturbations that do not apply on this machine are left out (see
    `applicable`).

    Args:
        runs: How many runs (the first is the baseline).
        names: Perturbations, from `KNOWN`.
        pinned_isa: The ISA cap the profile pins; None when nothing is pinned.
        threads: The profile's pool size (None: enable()'s default, 1); the
            `threads` perturbation gives the other runs `other_pool_size`.
    """
    reasons = applicable(pinned_isa)
    active = [name for name in names if reasons[name] is None]
    cpus = affinity() or []
    best = _isa.best_supported() if _isa.applies() else None
    caps = _isa_presets(pinned_isa)
    base_pool = threads or DEFAULT_THREADS
    other_pool = other_pool_size(threads)
    setups = []
    for index in range(runs):
        env: dict[str, str | None] = {}
        labels: dict[str, str] = {}
        run_cpus: tuple[int, ...] | None = None
        delay, neighbour = 0.0, False
        run_threads: int | None = None
        if AFFINITY in active:
            count = len(cpus) if index == 0 else max(1, len(cpus) - index)
            # Rotate which CPUs a smaller set gets, so runs do not share one.
            run_cpus = tuple(cpus[(index + k) % len(cpus)] for k in range(count))
            labels[AFFINITY] = f"{count} CPU{'s' if count > 1 else ''} {list(run_cpus)}"
        if ISA in active:
            # XLA:CPU gets the same cap as oneDNN, as enable() gives it.
            xla_flags = os.environ.get("XLA_FLAGS")
            if index == 0:
                env[_isa.ENV_VAR] = None
                env["XLA_FLAGS"] = xla_flags
                labels[ISA] = f"no cap preset (CPU best: {best})"
            else:
                cap = caps[(index - 1) % len(caps)]
                env[_isa.ENV_VAR] = cap
                env["XLA_FLAGS"] = _isa.with_xla_cap(xla_flags or "", cap)
                labels[ISA] = (
                    f"{_isa.ENV_VAR}={cap} preset, XLA:CPU capped alike (below this CPU's {best}: "
                    "the kernels of an older CPU generation)"
                )
        if CACHES in active:
            if index == 0:
                env[_cache_sizes.ENV_VAR] = None
                labels[CACHES] = "this CPU's cache sizes"
            else:
                geometries = _cache_sizes.others()
                geometry = geometries[(index - 1) % len(geometries)]
                env[_cache_sizes.ENV_VAR] = geometry.to_env()
                labels[CACHES] = (
                    f"cache sizes of an {geometry.describe()}, imitated in "
                    "Eigen's and oneDNN's CPUID results"
                )
        if THREADS in active:
            if index == 0:
                for key in _THREAD_VARIABLES:
                    env[key] = None
                labels[THREADS] = (
                    f"the profile's pool size ({base_pool} under enable(); "
                    "without tfdet, TensorFlow's default)"
                )
            else:
                run_threads = other_pool
                for key in _THREAD_VARIABLES:
                    env[key] = str(other_pool)
                labels[THREADS] = (
                    f"pool size {other_pool} instead of the profile's: not "
                    "another machine, a different setting; bits may follow it"
                )
        if HASHSEED in active:
            env["PYTHONHASHSEED"] = str(1 + index * 7919)
            labels[HASHSEED] = f"PYTHONHASHSEED={env['PYTHONHASHSEED']}"
        if NEIGHBOUR in active:
            neighbour = index == runs - 1 and index > 0
            labels[NEIGHBOUR] = "CPU-burning neighbour" if neighbour else "no neighbour"
        if STAGGER in active:
            delay = index * STAGGER_SECONDS
            labels[STAGGER] = f"started +{delay:.2f}s"
        setups.append(
            RunSetup(index, env, run_cpus, delay, neighbour, labels, run_threads)
        )
    return setups


def workers_of(setup: RunSetup, workers: int) -> list[RunSetup]:
    """The processes of a `workers`-worker run perturbed as `setup` says.

    Every worker gets the run's perturbations, and what only a cluster has:
    each worker its own hash seed (workers of a real cluster do not share
    one), and in a perturbed run with `stagger`, the workers start in reverse
    order, `STAGGER_SECONDS` apart. The baseline starts its workers together,
    in order.
    """
    gang = []
    for worker in range(workers):
        env = dict(setup.env)
        labels = dict(setup.labels)
        delay = setup.delay
        if HASHSEED in labels:
            env["PYTHONHASHSEED"] = str(int(setup.env["PYTHONHASHSEED"]) + worker)
            labels[HASHSEED] = f"PYTHONHASHSEED={env['PYTHONHASHSEED']}"
        if setup.neighbour and worker > 0:
            labels[NEIGHBOUR] = "CPU-burning neighbour (started beside worker 0)"
        if STAGGER in labels and setup.index > 0:
            delay += (workers - 1 - worker) * STAGGER_SECONDS
            labels[STAGGER] = (
                f"started +{delay:.2f}s (workers in reverse order, "
                f"{STAGGER_SECONDS}s apart)"
            )
        gang.append(
            dataclasses.replace(
                setup,
                env=env,
                labels=labels,
                delay=delay,
                # One CPU-burning neighbour per run is enough to disturb it.
                neighbour=setup.neighbour and worker == 0,
                worker=worker,
            )
        )
    return gang


def skipped(names: list[str], pinned_isa: str | None = "AVX2") -> dict[str, str]:
    """`{name: reason}` for requested perturbations that do not apply here."""
    reasons = applicable(pinned_isa)
    return {name: reasons[name] for name in names if reasons[name] is not None}
