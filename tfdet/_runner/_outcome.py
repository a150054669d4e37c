"""What a run left: its outcome record, and the words for how it ended.

`RunOutcome` is the parent's record of one child process (its exit, its
result, its stderr's tail, the stage it reached); `describe_exit` and
`stderr_tail` say how a process ended and what it last wrote.
"""

from __future__ import annotations

import dataclasses

from tfdet import _notices
from tfdet._protocol._perturb import RunSetup
from tfdet._protocol._result import WorkerResult
from tfdet._record import _trace

STDERR_TAIL_LINES = 25


# A failed run's traceback is kept whole up to this many lines.
TRACEBACK_LINES = 200


TRACEBACK_START = "Traceback (most recent call last):"


@dataclasses.dataclass
class RunOutcome:
    """What happened to one run.

    Attributes:
        setup: The perturbations it ran under.
        returncode: Exit status (None when it timed out).
        result: What the child answered when it finished (the record of
            its kind: `CheckResult`, `ScriptResult`, ...), or None when it
            failed.
        stderr_tail: The last lines of its stderr, without TensorFlow's
            start-up notices.
        timed_out: Whether it was killed for exceeding the timeout.
        seconds: Wall time from start to exit.
        failure: Why a run that exited 0 still failed (its result file is
            missing or unreadable, or it did not apply a perturbation it was
            given), or why tfdet could not start it.
        target_error: The run's report that its TARGET cannot be built or
            trained (exit 2 for the whole command), or None.
        stage: How far the TARGET got (`_spec.BUILDING`, `_spec.BUILT`),
            as the run told it; None before the TARGET function was called.
            A script's run, which builds no TARGET, says `_spec.TRAINING`
            once it trains, else None.
        interrupted: For a run of the `interrupt` perturbation, whether its
            first process was killed and a second one resumed it; None for
            any other run.
        trace: The trace its result names (a check's run), once read back
            (`read_traces`); None before, and when it failed or names none.
    """

    setup: RunSetup
    returncode: int | None
    result: WorkerResult | None
    stderr_tail: str
    timed_out: bool
    seconds: float
    failure: str | None = None
    target_error: str | None = None
    stage: str | None = None
    interrupted: bool | None = None
    trace: _trace.Trace | None = None

    @property
    def not_applied(self) -> dict[str, str]:
        """`{perturbation: "not applied: why"}` for those the run could not apply."""
        return {name: f"not applied: {why}" for name, why in self.unapplied.items()}

    @property
    def unapplied(self) -> dict[str, str]:
        """`{perturbation: why}` for those of its own the run could not apply."""
        given = {} if self.result is None else self.result.perturbations_not_applied
        reasons = {
            name: why for name, why in given.items() if name in self.setup.changes
        }
        if self.interrupted is not False:
            return reasons
        resuming = self.setup.resuming
        if resuming is not None and resuming not in reasons:
            # Ended before its kill (a script that failed first): its label
            # must not say it was killed and resumed.
            ended = "timed out" if self.timed_out else describe_exit(self.returncode)
            reasons[resuming] = f"the run ended ({ended}) before it was killed"
        # Under `migrate`, what the run was to resume under never started.
        for name in self.setup.changes.keys() - self.setup.killed_on.changes:
            reasons[name] = (
                "the run was never killed, so it never moved to the "
                "perturbations it was to resume under"
            )
        return reasons

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and self.result is not None
            and not self.timed_out
            and self.failure is None
        )

    @property
    def reason(self) -> str | None:
        """Why the run failed, in a few words (None when it is ok)."""
        if self.ok:
            return None
        if self.timed_out:
            return f"timed out after {self.seconds:.0f}s"
        if self.target_error:
            return "its TARGET cannot be built or trained"
        if self.failure:
            return self.failure
        if self.returncode:
            return describe_exit(self.returncode)
        return "exited 0 without writing its result"


def describe_exit(returncode: int | None) -> str:
    """A child's exit status in words: `exited 3`, `killed by signal 9`."""
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exited {returncode}"


def stderr_tail(path: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The end of a child's stderr, TensorFlow's notices left out.

    From its last traceback on, when it has one (up to `TRACEBACK_LINES`
    lines: the error whole, not its last lines); else its last `lines`.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = _notices.without_notices(handle.read())
    except OSError:
        return ""
    kept = text.splitlines(keepends=True)
    starts = [k for k, line in enumerate(kept) if line.startswith(TRACEBACK_START)]
    if starts and len(kept) - starts[-1] <= TRACEBACK_LINES:
        return "".join(kept[starts[-1] :])
    return "".join(kept[-lines:])
