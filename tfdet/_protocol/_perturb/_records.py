"""The records every perturbation is made of: `Context`, `Change`, `Perturbation`.

A perturbation module declares one `Perturbation`; its hooks read a
`Context` and return the `Change` of one process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping


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
