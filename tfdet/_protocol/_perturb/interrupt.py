"""`interrupt` (opt-in): run 1 killed at a step and resumed in a fresh process."""

from __future__ import annotations

from tfdet import _variables
from tfdet._protocol import _spec
from tfdet._protocol._perturb._records import Change, Context, Perturbation

INTERRUPT = "interrupt"

# The steps a script's interrupted run records before it is killed: a
# script's step count is not known beforehand.
SCRIPT_INTERRUPT_AFTER = 2


def _change(index: int, context: Context) -> Change:
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


def _in_child() -> str | None:
    steps = _spec.resumed_after()
    if steps is None:
        return None  # Not the process that resumes (it confirms, the first dies).
    return f"resumed in a fresh process after a SIGKILL at {steps} recorded steps"


PERTURBATION = Perturbation(
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
    change=_change,
    in_child=_in_child,
)
