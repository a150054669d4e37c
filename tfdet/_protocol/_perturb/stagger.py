"""`stagger`: each run (and a perturbed run's workers) started later."""

from __future__ import annotations

from tfdet._protocol._perturb._records import Change, Context, Perturbation

STAGGER = "stagger"
STAGGER_SECONDS = 0.75


def _change(index: int, context: Context) -> Change:
    delay = index * STAGGER_SECONDS
    return Change(f"started +{delay:.2f}s", delay=delay)


def _for_worker(change: Change, index: int, worker: int, workers: int) -> Change:
    # The baseline starts its workers together, in order; a perturbed run
    # starts them in reverse order.
    if index == 0:
        return change
    delay = change.delay + (workers - 1 - worker) * STAGGER_SECONDS
    return Change(
        f"started +{delay:.2f}s (workers in reverse order, {STAGGER_SECONDS}s apart)",
        delay=delay,
    )


PERTURBATION = Perturbation(
    name=STAGGER,
    description="a staggered start",
    imitates="Staggered starts: runs that do not start or reach each step together.",
    change=_change,
    for_worker=_for_worker,
)
