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

# One module per perturbation (`affinity.py` ... `batch.py`: its record, its
# hooks, its prose), the records they are made of (`_records`), their order
# (`_registry`), the plan of a check's runs (`_plan`) and the sentences of
# what the runs stand for (`_imitation`). The rest of tfdet reads the names
# below, from here.

from __future__ import annotations

from tfdet._protocol._perturb._imitation import (
    NOT_EMULATED,
    NOT_IMITATED,
    imitation_sections,
)
from tfdet._protocol._perturb._plan import (
    RunSetup,
    context,
    emulated_setup,
    plan,
    setup_of,
    skipped,
)
from tfdet._protocol._perturb._records import Change, Context, Perturbation
from tfdet._protocol._perturb._registry import (
    ALL,
    DESCRIPTIONS,
    IMITATED,
    KNOWN,
    REGISTRY,
    applied_in_child,
    parse,
    validate,
)
from tfdet._protocol._perturb.batch import BATCH
from tfdet._protocol._perturb.emulated_cpu import EMULATED_CPU
from tfdet._protocol._perturb.interrupt import INTERRUPT, SCRIPT_INTERRUPT_AFTER
from tfdet._protocol._perturb.migrate import MIGRATE
from tfdet._protocol._perturb.threads import THREADS

__all__ = [
    "ALL",
    "BATCH",
    "DESCRIPTIONS",
    "EMULATED_CPU",
    "IMITATED",
    "INTERRUPT",
    "KNOWN",
    "MIGRATE",
    "NOT_EMULATED",
    "NOT_IMITATED",
    "REGISTRY",
    "SCRIPT_INTERRUPT_AFTER",
    "THREADS",
    "Change",
    "Context",
    "Perturbation",
    "RunSetup",
    "applied_in_child",
    "context",
    "emulated_setup",
    "imitation_sections",
    "parse",
    "plan",
    "setup_of",
    "skipped",
    "validate",
]
