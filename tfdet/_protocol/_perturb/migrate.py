"""`migrate` (opt-in): `interrupt`, resumed under the run's other perturbations."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tfdet._protocol._perturb import interrupt
from tfdet._protocol._perturb._records import Change, Context, Perturbation

MIGRATE = "migrate"


def _change(index: int, context: Context) -> Change:
    change = interrupt.PERTURBATION.change(index, context)
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


def _supersedes(change: Change) -> Mapping[str, Change]:
    if not change.resumes:
        return {}
    # One kill and one resume: the run's `interrupt` is this one.
    return {interrupt.INTERRUPT: Change("killed and resumed as migrate says")}


PERTURBATION = Perturbation(
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
    change=_change,
    in_child=interrupt.PERTURBATION.in_child,
    supersedes=_supersedes,
)
