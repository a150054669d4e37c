"""`neighbour`: a CPU-burning process beside the last run while it trains.

It starts once the run has built its TARGET (a script: once it first calls
`fit`, `train_on_batch` or an optimizer), so it shares the CPUs with
training, not with TensorFlow's start.
"""

from __future__ import annotations

from tfdet._protocol._perturb._records import Change, Context, Perturbation

NEIGHBOUR = "neighbour"


def _change(index: int, context: Context) -> Change:
    # One neighbour, beside the last run: it slows every run sharing the CPUs.
    busy = index == context.runs - 1 and index > 0
    return Change("CPU-burning neighbour" if busy else "no neighbour", neighbour=busy)


def _for_worker(change: Change, index: int, worker: int, workers: int) -> Change:
    # One CPU-burning neighbour per run is enough to disturb it.
    if not change.neighbour or worker == 0:
        return change
    return Change("CPU-burning neighbour (started beside worker 0)")


PERTURBATION = Perturbation(
    name=NEIGHBOUR,
    description="a CPU-burning neighbour process while the run trains",
    imitates="A process burning one core: another machine's load and scheduling.",
    change=_change,
    for_worker=_for_worker,
)
