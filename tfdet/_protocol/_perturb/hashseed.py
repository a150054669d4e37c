"""`hashseed`: another PYTHONHASHSEED in each run, and in each worker."""

from __future__ import annotations

from tfdet._protocol._perturb._records import Change, Context, Perturbation

HASHSEED = "hashseed"


def _hash_seed(index: int, worker: int = 0) -> str:
    return str(1 + index * 7919 + worker)


def _change(index: int, context: Context) -> Change:
    seed = _hash_seed(index)
    return Change(f"PYTHONHASHSEED={seed}", env={"PYTHONHASHSEED": seed})


def _for_worker(change: Change, index: int, worker: int, workers: int) -> Change:
    # Workers of a real cluster do not share one hash seed.
    seed = _hash_seed(index, worker)
    return Change(f"PYTHONHASHSEED={seed}", env={"PYTHONHASHSEED": seed})


PERTURBATION = Perturbation(
    name=HASHSEED,
    description="a different PYTHONHASHSEED",
    imitates="Another PYTHONHASHSEED: another set and dict iteration order.",
    change=_change,
    for_worker=_for_worker,
)
