"""The plan of a check's runs: each run's `RunSetup`, and what is skipped.

`plan` gives each run after the baseline every selected perturbation that
applies (`skipped` says why the others do not); a `RunSetup` is whole for the
runner: its worker processes, the process that resumes it, what its child
must confirm.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

from tfdet import _variables
from tfdet._pin import _isa
from tfdet._pin._settings import threads_here
from tfdet._protocol import _emulation
from tfdet._protocol._perturb._records import Change, Context, Perturbation
from tfdet._protocol._perturb._registry import REGISTRY
from tfdet._protocol._perturb.emulated_cpu import EMULATED_CPU
from tfdet._protocol._perturb.interrupt import INTERRUPT
from tfdet._protocol._perturb.migrate import MIGRATE


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
        threads_here(threads),
        emulated_model,
        not_emulated=_emulation.why_unavailable(cap),
        workers=workers,
    )


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
            label=REGISTRY[INTERRUPT].change(index, context).label
            + " on the same machine (no other perturbation given to move to)",
        )
    return RunSetup(index, types.MappingProxyType(changes), workers=context.workers)


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
