"""What the commands' reports share: verdicts, the control's line, a process's facts.

A finished run's result is read as its kind's record (`result_of`). The
reports themselves are typed records, one module each
(`_check_report`, `_script_report`, `_locate_report`), built once;
`to_dict()` is their JSON. Nothing else writes a report's JSON, so the
Python object and the JSON file cannot disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_RUN_FAILED
from tfdet._patching import _registry
from tfdet._protocol import _perturb
from tfdet._protocol._result import WorkerResult
from tfdet.patches import pool_size_free_products

if TYPE_CHECKING:
    from tfdet._runner._outcome import RunOutcome


class Trained(Protocol):
    """What a finished run trained (a check's `Training`, a script's
    `ScriptTraining`): its fields for the `--json` entry."""

    def to_dict(self) -> dict[str, Any]: ...


# The patch (in the default) that makes each sample's predictions follow no batch.
_BATCH_FREE_PATCH = pool_size_free_products.PATCH.name


# Verdict of each exit code: the one mapping for devices and the whole check.
VERDICTS: dict[int, str] = {
    EXIT_OK: "identical",
    EXIT_DIVERGED: "diverged",
    EXIT_RUN_FAILED: "failed",
}


@dataclasses.dataclass(frozen=True)
class Control:
    """What the same check without tfdet found (`control=True`).

    Attributes:
        verdict: `"identical"`, `"diverged"` or `"failed"`.
        exit_code: 0, 1 or 3.
        divergence: Its first divergence in one sentence, or None.
    """

    verdict: str
    exit_code: int
    divergence: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Concluded(Protocol):
    """A check's report as its control reads it (`CheckReport`,
    `ScriptCheckReport`): its verdict, exit code and first divergence."""

    @property
    def verdict(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def divergence(self) -> Any: ...  # Its `description`, or None.


def control_of(plain: Concluded) -> Control:
    """What a check without tfdet found, for the report of the check with it."""
    divergence = plain.divergence
    return Control(
        verdict=plain.verdict,
        exit_code=plain.exit_code,
        divergence=None if divergence is None else divergence.description,
    )


def control_line(
    control: Control | None,
    verdict: str,
    perturbations: Iterable[str] = (),
    patches: Iterable[str] = (),
) -> str | None:
    """The report's sentence on its control: what the verdict proves.

    Args:
        control: `control_of` the check without tfdet, or None (no control).
        verdict: The check with tfdet's (`"identical"`, `"diverged"`,
            `"failed"`).
        perturbations: The names of the perturbations both checks applied.
        patches: The check's `tfdet.enable(patches=...)`.
    """
    if control is None:
        return None
    if control.verdict == "diverged":
        said = {
            "identical": "so tfdet is what made these runs identical",
            "diverged": "as these runs do with tfdet",
        }.get(
            verdict,
            "but these runs with tfdet failed, so whether tfdet keeps them "
            "identical is not known",
        )
        return (
            f"control without tfdet: diverged ({control.divergence}): these "
            f"perturbations separate plain TensorFlow, {said}"
        )
    if control.verdict != "identical":
        return "control without tfdet: a run failed, so nothing was compared"
    if verdict == "identical":
        return (
            "control without tfdet: identical too: these perturbations do not "
            "separate plain TensorFlow on this model, so an identical verdict "
            "proves little here"
        )
    if verdict != "diverged":
        return (
            "control without tfdet: identical: these perturbations do not "
            "separate plain TensorFlow on this model; these runs with tfdet "
            "failed, so nothing was compared with it"
        )
    line = (
        "control without tfdet: identical, where these runs with tfdet "
        "diverged: the kernels that tfdet's settings choose (its oneDNN ISA "
        "cap, AVX2 by default where plain TensorFlow uses this CPU's best "
        "instructions, among them) follow these perturbations on this model, "
        "and plain TensorFlow's do not"
    )
    if _perturb.BATCH in perturbations and _BATCH_FREE_PATCH not in _registry.resolve(
        patches
    ):
        line += (
            f"; for {_perturb.BATCH}: under tfdet a prediction's bits follow "
            f"its batch here, where {_BATCH_FREE_PATCH} was left out: the "
            "default `patches=auto` gives batch-invariant predictions"
        )
    return line


def headline(subject: str, exit_code: int, shape: str, enable: bool) -> str:
    """A report's first line: what was checked, the verdict, how."""
    mode = "with" if enable else "without"
    return (
        f"tfdet check {subject}: {VERDICTS[exit_code].upper()} (exit {exit_code}); "
        f"{shape}, {mode} tfdet.enable()"
    )


def pretty(report: Any, printer: Any, cycle: bool) -> None:
    """IPython and Jupyter show a report's `str`, not every field."""
    printer.text(f"{type(report).__name__}(...)" if cycle else str(report))


def combined_exit_code(codes: list[int]) -> int:
    """One exit code for several devices: a failure outranks a divergence."""
    return EXIT_RUN_FAILED if EXIT_RUN_FAILED in codes else max(codes, default=EXIT_OK)


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """What a report says of every run (or worker process), trained or not.

    Attributes:
        index: The run's number on its device (0 is the baseline).
        worker: The worker's task index in a multi-worker run, or None.
        name: `run N` or `run N worker K`.
        perturbations: `{name: what it changed}`, and `{name: "not applied:
            why"}` for those the run could not apply.
        ok: Whether it finished and wrote its result.
        reason: Why it failed, in a few words (None when ok).
        returncode: Its exit status (None when it timed out).
        timed_out: Whether it was killed for exceeding the timeout.
        seconds: Wall time from start to exit.
    """

    index: int
    worker: int | None
    name: str
    perturbations: dict[str, str]
    ok: bool
    reason: str | None
    returncode: int | None
    timed_out: bool
    seconds: float

    @classmethod
    def of(cls, outcome: RunOutcome) -> ProcessFacts:
        setup = outcome.setup
        return cls(
            index=setup.index,
            worker=setup.worker,
            name=setup.name,
            perturbations={**setup.labels, **outcome.not_applied},
            ok=outcome.ok,
            reason=outcome.reason,
            returncode=outcome.returncode,
            timed_out=outcome.timed_out,
            seconds=round(outcome.seconds, 3),
        )


_Result = TypeVar("_Result", bound=WorkerResult)


def result_of(outcome: RunOutcome, kind: type[_Result]) -> _Result:
    """The result a finished run (`outcome.ok`) wrote, as its kind's record
    (`CheckResult`, `ScriptResult`, ...).

    Raises:
        TypeError: the run left no result of that kind (it failed).
    """
    result = outcome.result
    if not isinstance(result, kind):
        raise TypeError(
            f"Expected {outcome.setup.name}'s {kind.__name__}. Received: {result!r}"
        )
    return result


def process_dict(
    facts: ProcessFacts,
    trained: Trained | None,
    stderr_tail: str | None,
) -> dict[str, Any]:
    """One process's `--json` entry, for a check's run and a script's: what
    is said of every run, then what a finished one trained, then the end of
    a failed one's stderr."""
    out = dataclasses.asdict(facts)
    if trained is not None:
        out.update(trained.to_dict())
    if stderr_tail is not None:
        out["stderr_tail"] = stderr_tail
    return out


def float_or_none(value: Any) -> float | None:
    # The JSON report keeps the loss as its exact decimal text.
    return None if value is None else float(value)
