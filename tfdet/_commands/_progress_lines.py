"""The progress lines the commands print while their runs go.

`tfdet check`, `tfdet locate` and `check --script` tell the user each run's
steps (`step_lines`, `steps_to`) and which runs are emulated and slower
(`slow_note`); the runner hands them the step numbers only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from tfdet._protocol._perturb import RunSetup

# Called with one line of progress for the user (`tfdet check`, `tfdet locate`).
ProgressFn = Callable[[str], None]


# Called as `on_step(device, run_index, steps_done, steps_total)`.
StepFn = Callable[[str, int, int, int], None]


def slow_note(setups: Sequence[RunSetup], timeout: float) -> str:
    """`; run 1 emulated: ...` for the progress line of runs that run slower."""
    slow = [setup for setup in setups if setup.slowdown > 1]
    if not slow:
        return ""
    names = ", ".join(setup.name for setup in slow)
    return (
        f"; {names} on an emulated CPU, far slower (minutes; stopped after "
        f"{timeout * slow[0].slowdown:.0f} s)"
    )


def steps_to(
    progress: ProgressFn | None, step: StepFn | None, device: str
) -> Callable[[int, int, int], None] | None:
    """A `run_jobs` progress callback for the runs on `device`: their step
    numbers to `step` when the caller gives one (a display), else lines to
    `progress` (`step_lines`)."""
    if step is None:
        return step_lines(progress, device)
    return functools.partial(step, device)


def step_lines(
    progress: ProgressFn | None, label: str = ""
) -> Callable[[int, int, int], None] | None:
    """A `run_jobs` progress callback that tells `progress` each run's steps.

    Lines read `[label] run I: step D/T`, without `[label] ` when it is empty
    and without `/T` when the total is unknown (0: a script's own loop).
    """
    if progress is None:
        return None
    prefix = f"[{label}] " if label else ""

    def on_step(index: int, done: int, total: int) -> None:
        of = f"/{total}" if total else ""
        progress(f"{prefix}run {index}: step {done}{of}")

    return on_step
