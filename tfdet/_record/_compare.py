"""Comparing the runs of a check: their traces, then what only their results hold.

Two runs are bit-identical when their traces agree step by step (as `tfdet
diff` compares them), every variable's exact final digest is the same and,
under the `batch` perturbation, every sample's prediction has the same bits.
A multi-worker run is one process per worker: worker k of one run is
compared with worker k of the other, and the earliest difference of any
worker is the run's.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from tfdet._protocol import _predict
from tfdet._protocol._result import CheckResult
from tfdet._record import _diff
from tfdet._record._trace import Trace


class FinishedRun(Protocol):
    """What a comparison reads of a finished process of a run: its trace,
    read back, and the result it wrote. Both are there once it finished;
    the check narrows a `RunOutcome`'s (None while it runs, or when it
    failed) in one place (`tfdet._commands._check._compared`)."""

    @property
    def trace(self) -> Trace: ...

    @property
    def result(self) -> CheckResult: ...


# One run: its processes (one, or each worker of a multi-worker run).
Job = list[FinishedRun]

# Two processes to compare: `(worker, process of run a, process of run b)`.
Pair = tuple[int, FinishedRun, FinishedRun]


def compare_runs(a: FinishedRun, b: FinishedRun) -> _diff.Divergence | None:
    """The first difference between two finished runs, or None when they are
    bit-identical.

    The traces are compared as `tfdet diff` compares them; when they agree,
    each variable's exact final digest is compared. A difference in the
    weights comes with the first differing element of that variable's final
    value (from the saved `.npz` weights). With the same weights, the
    `batch` perturbation's predictions, if any, are compared.
    """
    result_a, result_b = a.result, b.result
    names = list(result_a.variables)
    finals_a, finals_b = result_a.final_weights, result_b.final_weights
    differing = [
        name
        for name in [*names, *(n for n in finals_b if n not in finals_a)]
        if finals_a.get(name) != finals_b.get(name)
    ]
    # What only the final results hold is reported at the last step.
    last = a.trace.steps[-1] if a.trace.steps else {}
    at_last = (int(last.get("step", 0)), last.get("epoch"))
    divergence = _diff.first_divergence(a.trace, b.trace)
    if divergence is None and differing:
        name = differing[0]
        divergence = _diff.Divergence(
            *at_last,
            f"final weights:{name}",
            str(finals_a.get(name)),
            str(finals_b.get(name)),
        )
    if divergence is not None:
        return _with_weights_detail(divergence, result_a, result_b, differing)
    # The same weights: the `batch` perturbation's predictions, if any.
    predicted = _predict.first_difference(result_a, result_b)
    return None if predicted is None else _diff.Divergence(*at_last, *predicted)


def _with_weights_detail(
    divergence: _diff.Divergence,
    result_a: CheckResult,
    result_b: CheckResult,
    differing: list[str],
) -> _diff.Divergence:
    """A divergence in the weights, with the first differing element of the
    variable's final value from both runs' saved weights."""
    if "weights" not in divergence.quantity:
        return divergence
    names = list(result_a.variables)
    index = _diff.variable_index(divergence.quantity, names)
    if index is None:  # "weights": the first variable whose final value differs
        index = next((k for k, n in enumerate(names) if n in differing), None)
    if index is None:
        return divergence
    detail = _diff.weights_detail(result_a.weights_file, result_b.weights_file, index)
    if detail is None:
        return divergence
    return dataclasses.replace(divergence, detail={"variable": names[index], **detail})


def worker_pairs(a: Job, b: Job) -> list[Pair]:
    """Worker k of one run with worker k of the other."""
    return [(k, *pair) for k, pair in enumerate(zip(a, b, strict=True))]


def earliest(pairs: list[Pair]) -> tuple[int, _diff.Divergence | None]:
    """`(worker, divergence)` of the `(worker, a, b)` pair that diverges
    first; the lowest worker on a tie; `(0, None)` when every pair is
    bit-identical."""
    found = [
        (worker, divergence)
        for worker, a, b in pairs
        if (divergence := compare_runs(a, b)) is not None
    ]
    if not found:
        return 0, None
    return min(found, key=lambda each: (each[1].step, each[0]))


def compare_jobs(a: Job, b: Job) -> tuple[int, _diff.Divergence | None]:
    """`(worker, divergence)` of two runs' earliest difference, worker by worker."""
    return earliest(worker_pairs(a, b))


def comparisons(jobs: list[Job]) -> list[tuple[int, int, list[Pair]]]:
    """What a check compares, in the order it reports: `(run a, run b,
    [(worker, process of a, process of b), ...])`.

    First the workers of each multi-worker run with its worker 0 (they hold
    mirrored variables and log all-reduced values: any difference between
    them is a divergence, whatever the other runs did); then every run
    with the baseline, worker k with worker k.
    """
    within = [
        (index, index, [(k, job[0], job[k]) for k in range(1, len(job))])
        for index, job in enumerate(jobs)
        if len(job) > 1
    ]
    baseline = jobs[0]
    between = [
        (0, index, worker_pairs(baseline, job))
        for index, job in enumerate(jobs)
        if index > 0
    ]
    return [*within, *between]


def same_through(baseline: Job, rerun: Job, through: int | None) -> bool:
    """Whether a re-run has the baseline's bits through step `through`
    (None: the whole run, final weights and predictions included)."""
    if through is None:
        return compare_jobs(baseline, rerun)[1] is None  # No pair diverged.

    def prefix(trace: Trace) -> Trace:
        steps = [step for step in trace.steps if int(step.get("step", 0)) <= through]
        return dataclasses.replace(trace, steps=steps)

    return all(
        _diff.first_divergence(prefix(a.trace), prefix(b.trace)) is None
        for a, b in zip(baseline, rerun, strict=True)
    )
