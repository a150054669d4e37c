"""Spawning fresh training processes, concurrently, under perturbations.

Each run is `python -m <module> SPEC_JSON` with its own environment, CPU
affinity, start delay and optional CPU-burning neighbour. Progress lines on the
child's stdout are forwarded to a callback; stderr goes to a file whose tail is
kept for the report. A run that exits non-zero, writes no result, or exceeds
the timeout is a failure: it is never compared, let alone counted as equal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdet._perturb import RunSetup
from tfdet._worker import PROGRESS_PREFIX

STDERR_TAIL_LINES = 25


@dataclasses.dataclass
class RunOutcome:
    """What happened to one run.

    Attributes:
        setup: The perturbations it ran under.
        returncode: Exit status (None when it timed out).
        result: The worker's JSON result, or None when it failed.
        stderr_tail: The last lines of its stderr.
        timed_out: Whether it was killed for exceeding the timeout.
        seconds: Wall time from start to exit.
    """

    setup: RunSetup
    returncode: int | None
    result: dict[str, Any] | None
    stderr_tail: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None and not self.timed_out


def child_environment(
    base: dict[str, str], overrides: dict[str, str | None]
) -> dict[str, str]:
    """`base` with `overrides` applied (None unsets a variable)."""
    env = dict(base)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _burn() -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return subprocess.Popen(
        [sys.executable, "-c", "while True:\n    pass"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _tail(path: str, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


def _run_one(
    setup: RunSetup,
    module: str,
    spec: dict[str, Any],
    base_env: dict[str, str],
    workdir: str,
    timeout: float,
    progress: Callable[[int, int, int], None] | None,
) -> RunOutcome:
    time.sleep(setup.delay)
    spec = dict(spec, result=os.path.join(workdir, f"run{setup.index}.json"))
    stderr_path = os.path.join(workdir, f"run{setup.index}.stderr")
    env = child_environment(base_env, setup.env)
    cpus = set(setup.cpus) if setup.cpus else None

    def pin_affinity() -> None:  # Runs in the child before exec.
        if cpus:
            os.sched_setaffinity(0, cpus)

    neighbour = _burn() if setup.neighbour else None
    started = time.perf_counter()
    timed_out = False
    try:
        with open(stderr_path, "w", encoding="utf-8") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", module, json.dumps(spec)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                preexec_fn=pin_affinity if cpus else None,
            )
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                process.kill()

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                for line in process.stdout:
                    if line.startswith(PROGRESS_PREFIX) and progress is not None:
                        _, done, total = line.split()
                        progress(setup.index, int(done), int(total))
                process.wait()
            finally:
                timer.cancel()
                timed_out = killed.is_set()
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    seconds = time.perf_counter() - started
    result = None
    if process.returncode == 0 and not timed_out and os.path.exists(spec["result"]):
        with open(spec["result"], encoding="utf-8") as handle:
            result = json.load(handle)
    return RunOutcome(
        setup=setup,
        returncode=None if timed_out else process.returncode,
        result=result,
        stderr_tail=_tail(stderr_path),
        timed_out=timed_out,
        seconds=seconds,
    )


def run_all(
    setups: list[RunSetup],
    spec: dict[str, Any],
    workdir: str,
    *,
    module: str = "tfdet._worker",
    base_env: dict[str, str] | None = None,
    timeout: float = 600.0,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[RunOutcome]:
    """Starts one process per setup, all at once, and waits for all of them.

    Args:
        setups: One per run (their `delay` staggers the starts).
        spec: The JSON spec every run gets (`result` is filled in per run).
        workdir: Where results, weights and stderr files go.
        module: The module run as `python -m module SPEC_JSON`.
        base_env: The environment the setups' overrides apply to.
        timeout: Seconds before a run is killed and reported as timed out.
        progress: Called as `progress(run_index, steps_done, steps_total)`.

    Returns:
        One `RunOutcome` per setup, in order.
    """
    base_env = dict(os.environ if base_env is None else base_env)
    outcomes: list[RunOutcome | None] = [None] * len(setups)

    def target(slot: int, setup: RunSetup) -> None:
        outcomes[slot] = _run_one(
            setup, module, spec, base_env, workdir, timeout, progress
        )

    threads = [
        threading.Thread(target=target, args=(slot, setup), daemon=True)
        for slot, setup in enumerate(setups)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [outcome for outcome in outcomes if outcome is not None]
