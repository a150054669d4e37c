"""The TARGET's errors, apart from the training's: before any run, and after.

`preflight` builds a user's TARGET once in a child process before any run
is spawned; `raise_unbuilt_target` reads the runs' outcomes for a TARGET
that never built (exit 2) or never finished building (exit 3).
"""

from __future__ import annotations

from tfdet._errors import RunFailedError, TargetError
from tfdet._protocol import _spec
from tfdet._protocol._perturb import RunSetup
from tfdet._runner._outcome import RunOutcome
from tfdet._runner._process import run_environment
from tfdet._runner._spawn import run_all
from tfdet._target import _load


def preflight(spec: _load.TargetSpec, timeout: float) -> None:
    """Checks the TARGET before any run is spawned.

    Built-in targets are known to be good (parsing checked them); other
    targets are built once in a child process of the `preflight` kind (the
    same spawner and protocol as the runs), so a missing module or function,
    a function that exits or returns no compiled model or unusable data
    exits 2, and one that hangs exits 3 after `timeout`, before anything
    starts.

    Raises:
        TargetError: the TARGET cannot be built.
        RunFailedError: building it took longer than `timeout`.
    """
    if spec.text.startswith("builtin:"):
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tfdet-preflight-") as workdir:
        (outcome,) = run_all(
            [RunSetup(0)],
            _spec.WorkerSpec(_spec.PREFLIGHT, target=spec.text),
            workdir,
            base_env=run_environment(spec, "cpu"),
            timeout=timeout,
        )
    raise_unbuilt_target([outcome], spec.text, timeout)
    if not outcome.ok:
        # Ended before it said it was building (e.g. in `import keras`).
        raise _ended_while_building(outcome, spec.text)


def raise_unbuilt_target(
    outcomes: list[RunOutcome], target: str, timeout: float
) -> None:
    """Raises when the runs say their TARGET is at fault, not their training.

    A run's own report of a bad TARGET comes first. Then, when no run built
    the TARGET: a run stopped by `timeout` was still building it (or still
    starting), and a run that ended while building it was ended by the
    TARGET function (an `os._exit`, a crash in native code). Once one run has
    built it, a run that fails is a failed run (exit 3), not a bad TARGET.

    Raises:
        TargetError: the TARGET cannot be built (exit 2).
        RunFailedError: no run built it within `timeout` (exit 3).
    """
    for outcome in outcomes:
        if outcome.target_error is not None:
            raise TargetError(outcome.target_error)
    if any(outcome.stage == _spec.BUILT for outcome in outcomes):
        return
    if any(outcome.timed_out for outcome in outcomes):
        raise RunFailedError(
            f"Expected TARGET {target!r} to be built within `timeout={timeout:g}` "
            f"seconds. Received: still building after {timeout:g}s, stopped. "
            "Raise `timeout`, or make the TARGET function return sooner."
        )
    for outcome in outcomes:
        if outcome.stage == _spec.BUILDING and not outcome.ok:
            raise _ended_while_building(outcome, target)


def _ended_while_building(outcome: RunOutcome, target: str) -> TargetError:
    tail = outcome.stderr_tail.rstrip()
    code = outcome.returncode
    how = (
        f"killed by signal {-code}"
        if code is not None and code < 0
        else f"exit status {code}"
    )
    return TargetError(
        f"Expected TARGET {target!r} to return a model. Received: the "
        f"process building it ended ({how}) before the function "
        "returned (an `os._exit`, or a crash in native code); a TARGET "
        "function must return a model, not exit."
        + (f" Its output ends:\n{tail}" if tail else "")
    )
