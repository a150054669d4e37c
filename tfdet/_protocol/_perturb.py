"""Perturbations that make a run look like it is on another machine.

Each perturbation is one `Perturbation` record: its name, what it stands
for, when it does not apply, what it changes in each run (a `Change`:
environment, CPU affinity, start delay, a busy neighbour, pool size), how a
worker of a multi-worker run differs, and what a child process applies
itself (`in_child`, run by every kind of run through
`tfdet._child._start.child_start`). The plan (`plan`), attribution,
`skipped`, the reports and `--help` loop over `REGISTRY`: a new
perturbation is one record. They take plain values (a `Context`); a run's
options make theirs (`RunOptions.context`).

Run 0 of a check is the baseline; every other run differs in each selected
perturbation. Core count (through TensorFlow's default thread pools), the
oneDNN ISA and the cache sizes Eigen blocks its products by change the bits
when they are not pinned; the hash seed, a busy neighbour and a staggered
start must not change them at all.

These are imitations on one machine. Each record's `imitates` and
`NOT_IMITATED` say what a check can and cannot stand for: identical here is
not yet identical on a CPU of another vendor, which only two real machines
show (`benchmarks/portability.py`, `benchmarks/two_machines.sh`).
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdet import _variables
from tfdet._pin import _cache_sizes, _cpuid, _environment, _isa
from tfdet._pin._environment import affinity
from tfdet._pin._settings import DEFAULT_THREADS
from tfdet._protocol import _emulation, _predict, _spec

NONE = "none"
STAGGER_SECONDS = 0.75

# TensorFlow reads these when it starts: they set the pool size for a run
# without tfdet (with tfdet, `Change.threads` reaches enable()).
_THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclasses.dataclass(frozen=True)
class Context:
    """What planning a check's runs depends on.

    Attributes:
        runs: How many runs (run 0 is the baseline).
        pinned_isa: The ISA cap the runs' profile pins, canonical; None when
            nothing is pinned (`--no-enable`, `cpu_isa=None`, not x86-64).
        threads: The profile's pool size.
        emulated_model: The QEMU CPU model of the `emulated_cpu` runs (None:
            the other vendor's default).
        interrupt_after: The steps an `interrupt`ed run records before it is
            killed.
        interrupt_after_a_backup: The kill also waits for a step that follows
            one of the run's own backups (a script: it saves when it
            chooses); False: the run saves at every step (a TARGET's run).
        not_resumable: Why these runs cannot be interrupted and resumed
            (None: they can).
        not_predicting: Why these runs cannot predict their inputs for the
            `batch` perturbation (None: they can).
        not_emulated: Why no run can be emulated here (None: one can).
        workers: The processes of each run (a multi-worker run's workers).
    """

    runs: int
    pinned_isa: str | None
    threads: int
    emulated_model: str | None = None
    interrupt_after: int = 1
    interrupt_after_a_backup: bool = False
    not_resumable: str | None = None
    not_predicting: str | None = None
    not_emulated: str | None = None
    workers: int = 1


@dataclasses.dataclass(frozen=True)
class Change:
    """What one perturbation does to one process.

    Attributes:
        label: What this process had, for the report ("2 CPUs [0, 1]").
        env: Variables to set (None: unset) on top of the runs' environment.
        cpus: CPU affinity, or None for the parent's.
        delay: Seconds to wait before starting.
        neighbour: Whether a CPU-burning process runs alongside.
        threads: The pool size the process's `enable()` pins instead of the
            profile's (None: the profile's).
        by_child: Whether the process applies this change itself (its
            perturbation's `in_child`) and must confirm it in its result: a
            run that does not is a failed run, never one the report claims
            was perturbed.
        launcher: A command prefix the process runs under (an emulator).
        slowdown: How many times longer than native the process may take.
        resumes: Whether the process is killed at a step and resumed in a
            second one (started by the spawner as `RunSetup.resumed_on` says).
    """

    label: str
    env: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    cpus: tuple[int, ...] | None = None
    delay: float = 0.0
    neighbour: bool = False
    threads: int | None = None
    by_child: bool = False
    launcher: tuple[str, ...] = ()
    slowdown: float = 1.0
    resumes: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Perturbation:
    """One way a run is made to look like it is on another machine.

    Attributes:
        name: The `--perturb` name.
        description: One line for `--help`.
        imitates: The difference between machines it stands for, one
            sentence for the report (`imitated`; `varied` for a perturbation
            that is not another machine).
        other_machine: Whether it stands for another machine. False for
            another setting or event on the same machine (a pool size, a
            preemption): the report lists it under `varied`, never as an
            imitated machine.
        default: Whether `--perturb all` (the default) includes it.
        unavailable: `(context) -> why it cannot apply here, or None`.
        change: `(index, context) -> Change` of run `index` (0: baseline).
        for_worker: `(change, index, worker, workers) -> Change` of one
            worker process of a multi-worker run; None: every worker gets
            the run's change.
        in_child: Applied by the child process itself, before the TARGET or
            script runs (`_start.child_start`): reads what its `Change.env`
            set and returns what it did, or None when that run asked for
            nothing. None for a perturbation the parent applies alone.
        supersedes: `(change) -> {other perturbation: its Change}` for the
            same process: what this change decides for another one (an
            emulated CPU reports its own cache sizes). None: nothing.
    """

    name: str
    description: str
    imitates: str
    default: bool = True
    other_machine: bool = True
    unavailable: Callable[[Context], str | None] = lambda context: None
    change: Callable[[int, Context], Change]
    for_worker: Callable[[Change, int, int, int], Change] | None = None
    in_child: Callable[[], str | None] | None = None
    supersedes: Callable[[Change], Mapping[str, Change]] | None = None


# --- affinity ---------------------------------------------------------------


def _affinity_unavailable(context: Context) -> str | None:
    cpus = affinity()
    if cpus is None:
        return "CPU affinity is not available on this platform"
    if len(cpus) < 2:
        return "only one CPU is available"
    return None


def _affinity_change(index: int, context: Context) -> Change:
    cpus = affinity() or []
    count = len(cpus) if index == 0 else max(1, len(cpus) - index)
    # Rotate which CPUs a smaller set gets, so runs do not share one.
    chosen = tuple(cpus[(index + k) % len(cpus)] for k in range(count))
    return Change(f"{count} CPU{'s' if count > 1 else ''} {list(chosen)}", cpus=chosen)


# --- isa --------------------------------------------------------------------


def _isa_presets(pinned_isa: str | None) -> list[str]:
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


def _isa_unavailable(context: Context) -> str | None:
    if not _isa.applies():
        return "oneDNN ISA caps only exist on x86-64"
    if context.pinned_isa is not None:
        return (
            f"not applicable: the profile pins {_isa.ONEDNN_ISA_VARIABLE}={context.pinned_isa}, "
            "so a preset above it is overridden and one below it is a different "
            "profile; no preset imitates another CPU generation"
        )
    if not _isa_presets(None):
        return f"this CPU has nothing above AVX2 to cap ({_isa.best_supported()})"
    return None


def _isa_change(index: int, context: Context) -> Change:
    best = _isa.best_supported()
    # XLA:CPU gets the same cap as oneDNN, as enable() gives it.
    xla_flags = os.environ.get("XLA_FLAGS")
    if index == 0:
        return Change(
            f"no cap preset (CPU best: {best})",
            env={_isa.ONEDNN_ISA_VARIABLE: None, "XLA_FLAGS": xla_flags},
        )
    caps = _isa_presets(context.pinned_isa)
    cap = caps[(index - 1) % len(caps)]
    return Change(
        f"{_isa.ONEDNN_ISA_VARIABLE}={cap} preset, XLA:CPU capped alike (below this CPU's "
        f"{best}: the kernels of an older CPU generation)",
        env={
            _isa.ONEDNN_ISA_VARIABLE: cap,
            "XLA_FLAGS": _isa.with_xla_cap(xla_flags or "", cap),
        },
    )


# --- caches -----------------------------------------------------------------


def _caches_change(index: int, context: Context) -> Change:
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


def _caches_in_child() -> str | None:
    done = _cache_sizes.imitate_if_requested()
    return "; ".join(done) if done else None


# --- emulated_cpu -------------------------------------------------------------


def _emulated_model(context: Context) -> str:
    return context.emulated_model or _emulation.default_model()


def _emulated_change(index: int, context: Context) -> Change:
    if index == 0:
        return Change("native (this CPU)")
    model = _emulated_model(context)
    return Change(
        f"{_emulation.describe(model)} (an emulation, not real hardware; "
        f"allowed {_emulation.SLOWDOWN:g}x --timeout, as emulation is that much "
        "slower)",
        env={_variables.EMULATED_CPU: model},
        by_child=True,
        launcher=_emulation.launcher(model),
        slowdown=_emulation.SLOWDOWN,
    )


def _emulated_in_child() -> str | None:
    """What CPUID tells the process, when it was to run emulated."""
    model = os.environ.get(_variables.EMULATED_CPU)
    if not model:
        return None
    seen = _cpuid.describe()
    native = _cpuid_of_this_machine()
    if seen is None or seen == native:
        return None  # Not emulated after all: the run fails, unreported.
    return f"CPUID: {seen} ({model}; this machine: {native})"


def _cpuid_of_this_machine() -> str:
    facts = _environment.cpu_facts()
    return (
        f"{facts.get('cpu_vendor')} family {facts.get('cpu_family')} model "
        f"{facts.get('cpu_model_number')}"
    )


def _emulated_supersedes(change: Change) -> Mapping[str, Change]:
    if not change.launcher:
        return {}
    # The emulated CPU reports its own cache sizes through CPUID.
    return {CACHES: Change("the emulated CPU's own cache sizes (its CPUID)")}


# --- hashseed ---------------------------------------------------------------


def _hash_seed(index: int, worker: int = 0) -> str:
    return str(1 + index * 7919 + worker)


def _hashseed_change(index: int, context: Context) -> Change:
    seed = _hash_seed(index)
    return Change(f"PYTHONHASHSEED={seed}", env={"PYTHONHASHSEED": seed})


def _hashseed_for_worker(
    change: Change, index: int, worker: int, workers: int
) -> Change:
    # Workers of a real cluster do not share one hash seed.
    seed = _hash_seed(index, worker)
    return Change(f"PYTHONHASHSEED={seed}", env={"PYTHONHASHSEED": seed})


# --- neighbour --------------------------------------------------------------


def _neighbour_change(index: int, context: Context) -> Change:
    # One neighbour, beside the last run: it slows every run sharing the CPUs.
    busy = index == context.runs - 1 and index > 0
    return Change("CPU-burning neighbour" if busy else "no neighbour", neighbour=busy)


def _neighbour_for_worker(
    change: Change, index: int, worker: int, workers: int
) -> Change:
    # One CPU-burning neighbour per run is enough to disturb it.
    if not change.neighbour or worker == 0:
        return change
    return Change("CPU-burning neighbour (started beside worker 0)")


# --- stagger ----------------------------------------------------------------


def _stagger_change(index: int, context: Context) -> Change:
    delay = index * STAGGER_SECONDS
    return Change(f"started +{delay:.2f}s", delay=delay)


def _stagger_for_worker(
    change: Change, index: int, worker: int, workers: int
) -> Change:
    # The baseline starts its workers together, in order; a perturbed run
    # starts them in reverse order.
    if index == 0:
        return change
    delay = change.delay + (workers - 1 - worker) * STAGGER_SECONDS
    return Change(
        f"started +{delay:.2f}s (workers in reverse order, {STAGGER_SECONDS}s apart)",
        delay=delay,
    )


# --- threads ----------------------------------------------------------------


def other_pool_size(threads: int | None) -> int:
    """The pool size the other runs of a `threads` perturbation get.

    3 against a baseline of 1 or 2 (pools of 1 and 2 can give the same bits,
    where 3 gives other ones), 1 against any larger baseline.
    """
    return 3 if (threads or DEFAULT_THREADS) < 3 else 1


def _threads_change(index: int, context: Context) -> Change:
    if index == 0:
        return Change(
            f"the profile's pool size ({context.threads} under enable(); "
            "without tfdet, TensorFlow's default)",
            env=dict.fromkeys(_THREAD_VARIABLES),
        )
    pool = other_pool_size(context.threads)
    return Change(
        f"pool size {pool} instead of the profile's: not another machine, a "
        "different setting; bits may follow it",
        env=dict.fromkeys(_THREAD_VARIABLES, str(pool)),
        threads=pool,
    )


# --- interrupt ----------------------------------------------------------------


def _interrupt_change(index: int, context: Context) -> Change:
    if index == 0:
        return Change("not interrupted")
    steps = context.interrupt_after
    when = f"after {steps} recorded step{'s' if steps > 1 else ''}"
    if context.interrupt_after_a_backup:
        when = f"at its first recorded step past {steps} that follows a backup"
    return Change(
        f"killed (SIGKILL) {when} and resumed in a fresh process",
        env={_variables.INTERRUPT_AFTER: str(steps)},
        by_child=True,
        resumes=True,
    )


def _migrate_change(index: int, context: Context) -> Change:
    change = _interrupt_change(index, context)
    if index == 0:
        return change
    return dataclasses.replace(
        change,
        label=change.label.replace(
            "and resumed in a fresh process",
            "on this machine, and resumed in a fresh process under the run's "
            "other perturbations (the training moved to another imitated machine)",
        ),
    )


def _migrate_supersedes(change: Change) -> Mapping[str, Change]:
    if not change.resumes:
        return {}
    # One kill and one resume: the run's `interrupt` is this one.
    return {INTERRUPT: Change("killed and resumed as migrate says")}


def _interrupt_in_child() -> str | None:
    steps = _spec.resumed_after()
    if steps is None:
        return None  # Not the process that resumes (it confirms, the first dies).
    return f"resumed in a fresh process after a SIGKILL at {steps} recorded steps"


# --- batch --------------------------------------------------------------------


def _batch_change(index: int, context: Context) -> Change:
    if index == 0:
        return Change(
            "predicted its inputs in one batch, in order",
            env={_variables.PREDICT: _predict.WHOLE},
        )
    sizes = ", ".join(map(str, _predict.SPLIT_SIZES))
    return Change(
        f"predicted its inputs in another order, in batches of {sizes} in turn",
        env={_variables.PREDICT: _predict.SPLIT},
        by_child=True,
    )


def _batch_in_child() -> str | None:
    if _predict.requested() != _predict.SPLIT:
        return None  # Run 0 predicts too, as asked; nothing to confirm.
    return "predicts its inputs in another order and other batch sizes"


# --- the registry -----------------------------------------------------------

AFFINITY = "affinity"
ISA = "isa"
CACHES = "caches"
HASHSEED = "hashseed"
NEIGHBOUR = "neighbour"
STAGGER = "stagger"
THREADS = "threads"
EMULATED_CPU = "emulated_cpu"
INTERRUPT = "interrupt"
MIGRATE = "migrate"
BATCH = "batch"

REGISTRY: Mapping[str, Perturbation] = types.MappingProxyType(
    {
        record.name: record
        for record in (
            Perturbation(
                name=AFFINITY,
                description="a different CPU affinity (core count)",
                imitates="Fewer CPUs in the affinity mask: what another core count "
                "does to TensorFlow's default thread pools (pinned by enable(), so "
                "it matters only without tfdet).",
                unavailable=_affinity_unavailable,
                change=_affinity_change,
            ),
            Perturbation(
                name=ISA,
                description="a lower ONEDNN_MAX_CPU_ISA preset (an older x86 CPU "
                "generation); only without a pinned cap (--no-enable or "
                "cpu_isa=None)",
                imitates="A lower oneDNN ISA cap: the kernels an older x86 CPU "
                "generation would run, when no cap is pinned.",
                unavailable=_isa_unavailable,
                change=_isa_change,
            ),
            Perturbation(
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
                change=_caches_change,
                in_child=_caches_in_child,
            ),
            Perturbation(
                name=HASHSEED,
                description="a different PYTHONHASHSEED",
                imitates="Another PYTHONHASHSEED: another set and dict iteration "
                "order.",
                change=_hashseed_change,
                for_worker=_hashseed_for_worker,
            ),
            Perturbation(
                name=NEIGHBOUR,
                description="a CPU-burning neighbour process during the run",
                imitates="A process burning one core: another machine's load and "
                "scheduling.",
                change=_neighbour_change,
                for_worker=_neighbour_for_worker,
            ),
            Perturbation(
                name=STAGGER,
                description="a staggered start",
                imitates="Staggered starts: runs that do not start or reach each "
                "step together.",
                change=_stagger_change,
                for_worker=_stagger_for_worker,
            ),
            Perturbation(
                name=THREADS,
                description="another thread-pool size (not in 'all': a different "
                "setting, not another machine; shows whether the bits follow the "
                "pool size)",
                imitates="Another thread-pool size (opt-in): a different setting "
                "on the same CPU, not another machine.",
                # Under `enable()` another pool size is another profile, and bits
                # follow the pool size, so in the default set it would make the
                # check fail by design.
                default=False,
                other_machine=False,
                change=_threads_change,
            ),
            Perturbation(
                name=EMULATED_CPU,
                description="one run on an emulated x86 CPU of another vendor "
                "(QEMU user mode, --emulate-cpu MODEL; opt-in: 5-10x slower)",
                imitates="Another x86 implementation, emulated: QEMU's CPU model "
                "reports another vendor, family, model and cache sizes through "
                "CPUID (oneDNN and Eigen dispatch and block on them), and its code "
                "generator computes the approximate instructions (RSQRTPS, RCPPS) "
                "exactly where AMD and Intel each approximate their own way. Not "
                "Intel's or AMD's own tables, AVX-512/AMX paths, or real caches.",
                # An emulated run is 5-10x slower: a check would take minutes.
                default=False,
                unavailable=lambda context: context.not_emulated,
                change=_emulated_change,
                in_child=_emulated_in_child,
                supersedes=_emulated_supersedes,
            ),
            Perturbation(
                name=INTERRUPT,
                description="run 1 killed (SIGKILL) halfway and resumed in a "
                "fresh process: by tfdet's checkpoint of a TARGET, by the "
                "script's own (e.g. BackupAndRestore) under --script (opt-in)",
                imitates="A preemption: the run is killed at a step and resumed "
                "in a fresh process from its last checkpoint, as on a "
                "preemptible machine or a time-limited job.",
                # Another kind of difference than another machine: asked for.
                default=False,
                other_machine=False,
                unavailable=lambda context: context.not_resumable,
                change=_interrupt_change,
                in_child=_interrupt_in_child,
            ),
            Perturbation(
                name=MIGRATE,
                description="run 1 trained on this machine, killed (SIGKILL) "
                "halfway and resumed in a fresh process under the other "
                "perturbations given (e.g. threads, caches, emulated_cpu): a "
                "training that moves to another machine (opt-in)",
                imitates="A training moved between machines: killed at a step on "
                "this machine and resumed in a fresh process, from its last "
                "checkpoint, on the imitated machine the run's other "
                "perturbations make (as a preempted job restarts on whichever "
                "machine is free).",
                default=False,
                other_machine=False,
                unavailable=lambda context: context.not_resumable,
                change=_migrate_change,
                in_child=_interrupt_in_child,
                supersedes=_migrate_supersedes,
            ),
            Perturbation(
                name=BATCH,
                description="after training, run 1 predicts the TARGET's "
                "inputs in another order and in batches of 1, 5 and 32, run 0 "
                "in one batch, and each sample's output bits are compared: "
                "batch invariance (opt-in; TARGETs)",
                imitates="Another batch around each sample at prediction: "
                "what else is in it and where the sample sits (a served "
                "model's request batching, predict on one sample).",
                default=False,
                other_machine=False,
                unavailable=lambda context: context.not_predicting,
                change=_batch_change,
                in_child=_batch_in_child,
            ),
        )
    }
)

# The default set ("all"): what must not change the bits under one profile.
ALL = tuple(name for name, record in REGISTRY.items() if record.default)
KNOWN = tuple(REGISTRY)
DESCRIPTIONS = {name: record.description for name, record in REGISTRY.items()}
IMITATED = {name: record.imitates for name, record in REGISTRY.items()}

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


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """How one process is made to look like another machine.

    Attributes:
        index: Run number; 0 is the baseline.
        changes: `{perturbation: its Change for this process}`.
        worker: Task index of this process in a multi-worker run (see
            `processes`), or None for a run of one process.
        tf_config: The `TF_CONFIG` of a multi-worker run's process (its
            loopback cluster), or None.
        workers: How many processes the run has (a multi-worker run's).
    """

    index: int
    changes: Mapping[str, Change] = dataclasses.field(default_factory=dict)
    worker: int | None = None
    tf_config: str | None = None
    workers: int = 1

    @property
    def processes(self) -> list[RunSetup]:
        """The processes of this run: itself, or each worker of a multi-worker run.

        Every worker gets the run's perturbations, and what only a cluster
        has (each record's `for_worker`: e.g. each worker its own hash seed).
        """
        if self.workers == 1 or self.worker is not None:
            return [self]
        gang = []
        for worker in range(self.workers):
            changes = {}
            for name, change in self.changes.items():
                record = REGISTRY[name]
                if record.for_worker is not None:
                    change = record.for_worker(change, self.index, worker, self.workers)
                changes[name] = change
            gang.append(
                dataclasses.replace(
                    self, changes=types.MappingProxyType(changes), worker=worker
                )
            )
        return gang

    @property
    def env(self) -> dict[str, str | None]:
        """Variables to set (None: unset) on top of the runs' environment."""
        merged: dict[str, str | None] = {}
        for change in self.changes.values():
            merged.update(change.env)
        if self.tf_config is not None:
            merged["TF_CONFIG"] = self.tf_config
        return merged

    @property
    def cpus(self) -> tuple[int, ...] | None:
        """CPU affinity, or None for the parent's."""
        return next((c.cpus for c in self.changes.values() if c.cpus), None)

    @property
    def delay(self) -> float:
        """Seconds to wait before starting."""
        return sum(change.delay for change in self.changes.values())

    @property
    def neighbour(self) -> bool:
        """Whether a CPU-burning process runs alongside."""
        return any(change.neighbour for change in self.changes.values())

    @property
    def threads(self) -> int | None:
        """The pool size this process's `enable()` pins instead of the profile's."""
        return next(
            (c.threads for c in self.changes.values() if c.threads is not None), None
        )

    @property
    def launcher(self) -> tuple[str, ...]:
        """The command prefix the process runs under (an emulator), or ()."""
        return next((c.launcher for c in self.changes.values() if c.launcher), ())

    @property
    def slowdown(self) -> float:
        """How many times longer than native the process may take."""
        return max((c.slowdown for c in self.changes.values()), default=1.0)

    @property
    def resumes(self) -> bool:
        """Whether the process is killed at a step and resumed in a second one."""
        return any(change.resumes for change in self.changes.values())

    @property
    def resuming(self) -> str | None:
        """The perturbation that kills and resumes this process (None: none)."""
        return next(
            (name for name, change in self.changes.items() if change.resumes), None
        )

    @property
    def killed_on(self) -> RunSetup:
        """The setup of the process that is killed, before the run resumes.

        Under `migrate` it has only the kill: the run's other perturbations
        start with the process that resumes it. Otherwise this setup.
        """
        if self.resuming != MIGRATE:
            return self
        return dataclasses.replace(
            self, changes=types.MappingProxyType({MIGRATE: self.changes[MIGRATE]})
        )

    @property
    def resumed_on(self) -> RunSetup:
        """The setup of the process that resumes the run once it was killed.

        Its kill becomes the resume: `TFDET_RESUMED_AFTER` holds the steps
        asked before the kill (the resumed process reads those the killed
        one recorded from the file it left: a script's is killed after the
        first backup past the steps asked).
        """
        name = self.resuming
        if name is None:
            return self
        change = self.changes[name]
        steps = change.env.get(_variables.INTERRUPT_AFTER)
        resumed = dataclasses.replace(
            change,
            env={_variables.INTERRUPT_AFTER: None, _variables.RESUMED_AFTER: steps},
        )
        changes = {**self.changes, name: resumed}
        return dataclasses.replace(self, changes=types.MappingProxyType(changes))

    @property
    def confirmed_by_child(self) -> list[str]:
        """The perturbations this process must apply itself and confirm."""
        return [name for name, change in self.changes.items() if change.by_child]

    @property
    def labels(self) -> dict[str, str]:
        """`{perturbation: what this process had}`, for the report."""
        return {name: change.label for name, change in self.changes.items()}

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
        changes = dict(self.changes)
        if name is not None and name in other.changes:
            changes[name] = other.changes[name]
        return RunSetup(index, types.MappingProxyType(changes), workers=self.workers)

    def one_at_a_time(self, other: RunSetup) -> list[tuple[str | None, RunSetup]]:
        """The re-runs that find which perturbation separates this run from
        `other`: `(None, this setup again)`, then `(name, this setup with
        other's perturbation name)` for each perturbation they differ in
        (numbered from 100, apart from the planned runs)."""
        differing = [
            name
            for name, label in other.labels.items()
            if self.labels.get(name) != label
        ]
        candidates: list[str | None] = [None, *differing]
        return [
            (name, self.with_perturbation_of(other, name, 100 + k))
            for k, name in enumerate(candidates)
        ]


def context(
    runs: int,
    pinned_isa: str | None,
    threads: int | None,
    emulated_model: str | None = None,
    workers: int = 1,
) -> Context:
    """The planning context of `runs` runs of a profile (see `Context`).

    Args:
        runs: How many runs (the first is the baseline).
        pinned_isa: The ISA cap the profile pins (any spelling `_isa`
            accepts); None when nothing is pinned.
        threads: The profile's pool size (None: enable()'s default).
        emulated_model: The QEMU CPU model of `emulated_cpu` (None: default).
        workers: The processes of each run (a multi-worker run's workers).
    """
    cap = None
    if pinned_isa is not None and _isa.applies():
        cap = _isa.normalize(pinned_isa)
    cap = None if cap == "ALL" else cap
    return Context(
        runs,
        cap,
        threads or DEFAULT_THREADS,
        emulated_model,
        not_emulated=_emulation.why_unavailable(cap),
        workers=workers,
    )


def _duplicates(names: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({name for name in names if name in seen or seen.add(name)})


def validate(names: Sequence[str]) -> list[str]:
    """Checks a sequence of perturbation names (empty: none); returns a list.

    Raises:
        ValueError: an unknown or repeated name, listing the known ones.
    """
    names = list(names)
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise ValueError(
            f"Expected `perturb` names from {', '.join(KNOWN)} (or all, none). "
            f"Received: perturb={','.join(names)!r} (unknown: {', '.join(unknown)})"
        )
    repeated = _duplicates(names)
    if repeated:
        raise ValueError(
            "Expected each `perturb` name once. Received: "
            f"perturb={','.join(names)!r} ({', '.join(repeated)} repeated). "
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
            (`perturb`) and says what to pass.
    """
    if text is None or text.strip() == "all":
        return list(ALL)
    if text.strip() == NONE:
        return []
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or "" in parts:
        raise ValueError(
            "Expected `perturb` to be all, none or comma-separated names from "
            f"{', '.join(KNOWN)}. Received: perturb={text!r} (an empty name). "
            "Pass `perturb=none` for identical processes."
        )
    special = [part for part in parts if part in ("all", NONE)]
    if special:
        raise ValueError(
            f"Expected '{special[0]}' alone in `perturb`. Received: "
            f"perturb={text!r}. Pass either '{special[0]}' or a list of names."
        )
    return validate(parts)


def setup_of(index: int, active: Sequence[Perturbation], context: Context) -> RunSetup:
    """Run `index` perturbed by each of `active` (and what they supersede)."""
    changes = {record.name: record.change(index, context) for record in active}
    for record in active:
        if record.supersedes is not None:
            for name, change in record.supersedes(changes[record.name]).items():
                if name in changes:
                    changes[name] = change
    moved = changes.get(MIGRATE)
    if moved is not None and moved.resumes and not set(changes) - {MIGRATE, INTERRUPT}:
        changes[MIGRATE] = dataclasses.replace(
            moved,
            label=_interrupt_change(index, context).label
            + " on the same machine (no other perturbation given to move to)",
        )
    return RunSetup(index, types.MappingProxyType(changes), workers=context.workers)


# The steps a script's interrupted run records before it is killed: a
# script's step count is not known beforehand.
SCRIPT_INTERRUPT_AFTER = 2


def plan(context: Context, names: Sequence[str]) -> list[RunSetup]:
    """One `RunSetup` per run, each run after the baseline perturbed in every
    name that applies in `context` (the others are `skipped`)."""
    active = [
        REGISTRY[name] for name in names if REGISTRY[name].unavailable(context) is None
    ]
    return [setup_of(index, active, context) for index in range(context.runs)]


def skipped(context: Context, names: Sequence[str]) -> dict[str, str]:
    """`{name: reason}` for the perturbations of `names` that do not apply."""
    return {
        name: reason
        for name in names
        if (reason := REGISTRY[name].unavailable(context)) is not None
    }


def emulated_setup(context: Context) -> RunSetup:
    """One run on the emulated CPU of `context` (`locate --record --emulate-cpu`)."""
    return dataclasses.replace(setup_of(1, [REGISTRY[EMULATED_CPU]], context), index=0)


def applied_in_child() -> dict[str, str]:
    """Applies every in-child perturbation this process's environment asks for.

    Called by `tfdet._child._start.child_start` in every kind of run.

    Returns:
        `{perturbation: what was done}` for each one applied.
    """
    done = {}
    for name, record in REGISTRY.items():
        if record.in_child is not None:
            what = record.in_child()
            if what is not None:
                done[name] = what
    return done
