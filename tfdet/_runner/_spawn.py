"""Spawning fresh training processes, concurrently, under perturbations.

Each process is `python -m tfdet._child SPEC_JSON` (see
`tfdet._child._start`: one spec type, one start, one result and progress
protocol for every kind of run) with its own environment, CPU affinity,
start delay and optional CPU-burning neighbour (`_process`). Progress lines
arrive on a pipe of their own (`_progress`) and go to a callback; stdout
and stderr go to files, the stderr tail is kept for the report
(`_outcome`). A run ends when its own process ends: whatever it started is
stopped then (its process group), and a helper it left holding a descriptor
cannot keep the run going. A run that exits non-zero, writes no result,
exceeds the timeout or does not confirm a perturbation it was to apply
itself is a failure: it is never compared, let alone counted as equal.

This module schedules: `run_jobs` starts the jobs of a check side by side
(a job is one process, or the workers of a tf.distribute cluster, see
`_cluster`), `run_all` one process per setup, `read_traces` reads what
they recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from tfdet._errors import TraceFormatError
from tfdet._protocol import _result, _spec
from tfdet._protocol._perturb import RunSetup
from tfdet._protocol._result import CheckResult, WorkerResult
from tfdet._record import _trace
from tfdet._runner._cluster import cluster_config, free_ports
from tfdet._runner._conversation import Conversation
from tfdet._runner._outcome import RunOutcome, describe_exit, stderr_tail
from tfdet._runner._process import Neighbour, ProcessGroup, child_environment, kill_tree
from tfdet._runner._progress import follow_progress


def _read_result(
    setup: RunSetup, kind: str, path: str
) -> tuple[WorkerResult | None, str | None, str | None]:
    """`(result, failure, target_error)` from a `kind` run's result file.

    The caller trusts the result only from a process that exited 0.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None, None, None
    except (OSError, ValueError) as error:
        return None, f"exited 0 but its result is unreadable ({error})", None
    said_error = data.get("error") if isinstance(data, dict) else None
    if isinstance(said_error, dict) and said_error.get("kind") == _spec.TARGET_ERROR:
        return None, None, str(said_error.get("message"))
    try:
        result = _result.read(kind, data)
    except ValueError as error:
        return None, f"exited 0 but its result is unreadable ({error})", None
    # A run may say why it could not apply one (a script that wrote no
    # backup to resume from is never interrupted): the report says so.
    said = {**result.perturbations_applied, **result.perturbations_not_applied}
    missing = [name for name in setup.confirmed_by_child if name not in said]
    if missing:
        return (
            None,
            f"did not apply the {', '.join(missing)} perturbation it was given "
            "(it would have been reported as applied)",
            None,
        )
    return result, None, None


def _start_and_wait(
    command: list[str],
    env: dict[str, str],
    stem: str,
    setup: RunSetup,
    progress: Callable[[int, int, int], None] | None,
    stages: list[str],
    group: ProcessGroup,
    timeout: float,
    cwd: str | None,
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen, bool]:
    """Runs one process of a run to its end: `(process, timed out)`.

    `command` ends with the spec, whose progress descriptor is replaced by
    this process's own pipe. Output is appended to the run's files, the
    stages it reports to `stages`; `on_training` is called when it trains
    (`forward_progress`). A run with a `conversation` also gets a
    request pipe of its own, and no limit on its whole life: the
    conversation times each answer (see `_conversation`).
    """
    read_fd, write_fd = os.pipe()
    requests_read, requests_write = os.pipe() if conversation else (-1, -1)
    spec = dataclasses.replace(
        _spec.WorkerSpec.from_json(command[-1]),
        progress_fd=write_fd,
        requests_fd=requests_read if conversation else None,
    )
    cpus = set(setup.cpus or ())  # Empty: the parent's affinity.

    def pin_affinity() -> None:  # Runs in the child before exec.
        os.sched_setaffinity(0, cpus)

    ended = threading.Event()
    follower = follow_progress(
        read_fd, setup.index, progress, stages, ended, conversation, on_training
    )
    killed = threading.Event()
    process = None
    try:
        with (
            open(f"{stem}.stdout", "ab") as stdout,
            open(f"{stem}.stderr", "ab") as stderr,
        ):
            process = group.start(
                [*command[:-1], spec.to_json()],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(write_fd, requests_read) if conversation else (write_fd,),
                preexec_fn=pin_affinity if cpus else None,
                cwd=cwd,
            )
        os.close(write_fd)
        write_fd = -1

        def kill() -> None:
            killed.set()
            kill_tree(process)

        # An emulated run is given as many times longer as it runs slower.
        timer = threading.Timer(timeout * setup.slowdown, kill)
        if conversation is None:
            timer.start()
        else:
            os.close(requests_read)
            requests_read = -1
            conversation.started(
                requests_write, kill, lambda: stderr_tail(f"{stem}.stderr")
            )
            requests_write = -1
        try:
            process.wait()
        finally:
            timer.cancel()
            # The run is over when its own process is: whatever it started
            # and left behind (a helper, a fork) goes with it.
            kill_tree(process)
    finally:
        for fd in (write_fd, requests_read, requests_write):
            if fd >= 0:
                os.close(fd)
        ended.set()
        follower.join(timeout=5)
        if conversation is not None:
            # After the follower: every answer the run wrote is received.
            conversation.ended(
                "did not start"
                if process is None
                else "killed at the timeout"
                if killed.is_set()
                else describe_exit(process.returncode)
            )
    return process, killed.is_set()


def _run_one(
    setup: RunSetup,
    module: str,
    spec: _spec.WorkerSpec,
    base_env: dict[str, str],
    workdir: str,
    timeout: float,
    progress: Callable[[int, int, int], None] | None,
    group: ProcessGroup,
    cwd: str | None = None,
    conversation: Conversation | None = None,
    prefix: Sequence[str] = (),
) -> RunOutcome:
    stem = os.path.join(workdir, setup.file_stem)
    spec = dataclasses.replace(
        spec,
        result=f"{stem}.json",
        trace=f"{stem}.jsonl",
        resume_dir=f"{stem}.resume" if setup.resumes else None,
    )
    stages: list[str] = []

    def start(process_setup: RunSetup) -> tuple[subprocess.Popen, bool]:
        """One process of the run, perturbed as `process_setup` says."""
        process_spec = dataclasses.replace(
            spec,
            threads=spec.threads
            if process_setup.threads is None
            else process_setup.threads,
        )
        command = [
            *prefix,
            *process_setup.launcher,
            sys.executable,
            "-m",
            module,
            process_spec.to_json(),
        ]
        env = child_environment(base_env, process_setup.env)
        return _start_and_wait(
            command,
            env,
            stem,
            process_setup,
            progress,
            stages,
            group,
            timeout,
            cwd,
            conversation,
            None if neighbour is None else neighbour.start,
        )

    neighbour = Neighbour(group) if setup.neighbour else None
    try:
        if group.stopped.wait(setup.delay):
            raise RuntimeError("tfdet: runs were stopped before this one started")
        started = time.perf_counter()
        # Under `migrate` the killed process has none of the run's other
        # perturbations: they start with the process that resumes it.
        process, timed_out = start(setup.killed_on)
        resumed = (
            setup.resumes and not timed_out and process.returncode == -signal.SIGKILL
        )
        if resumed:
            # `interrupt` or `migrate`: killed as a preemption kills, now
            # resumed in a fresh process from what the first one saved.
            process, timed_out = start(setup.resumed_on)
    finally:
        if neighbour is not None:
            neighbour.stop()
    seconds = time.perf_counter() - started
    # What the process that wrote the result was given to apply.
    result, failure, target_error = _read_result(
        setup if resumed else setup.killed_on, spec.kind, spec.result
    )
    if process.returncode != 0 or timed_out:
        # Its exit status says why; a result it left is not trusted.
        result, failure = None, None
    elif result is None and failure is None and target_error is None:
        failure = "exited 0 without writing its result"
    stage = stages[-1] if stages else None
    # A run that ended while building its TARGET stops no other: whether the
    # TARGET is at fault (every run ends so) or this run's perturbation is
    # (another run builds it) is decided once all have built or ended.
    if result is None and (stage != _spec.BUILDING or timed_out):
        group.fail(setup)
        if group.first_failure is not None and group.first_failure != setup:
            failure = f"stopped after {group.first_failure.name} failed"
            timed_out = False
    return RunOutcome(
        setup=setup,
        returncode=None if timed_out else process.returncode,
        result=result,
        stderr_tail=stderr_tail(f"{stem}.stderr"),
        timed_out=timed_out,
        seconds=seconds,
        failure=failure,
        target_error=target_error,
        stage=stage,
        interrupted=resumed if setup.resumes else None,
    )


def _failed(setup: RunSetup, error: BaseException) -> RunOutcome:
    """The outcome of a run that tfdet itself could not start or follow."""
    text = "".join(traceback.format_exception(error))
    return RunOutcome(
        setup,
        None,
        None,
        text[-4000:],
        timed_out=False,
        seconds=0.0,
        failure=f"tfdet could not start or follow it ({error!r})",
    )


def _jobs(setups: Sequence[RunSetup]) -> list[list[RunSetup]]:
    """The processes of each run (`RunSetup.processes`); a multi-worker run's
    each with its `TF_CONFIG` on loopback.

    The ports of every run are chosen at once: chosen run by run, a port
    closed after one run's choice could be handed to the next run too, and
    the two runs' workers would join each other's cluster. (Both runs of a
    two-worker check failed once in a test run, "tried to connect with a
    different incarnation", 2-core AMD EPYC Zen 5: this, or another
    program taking a port between its choice and the worker's bind, which
    stays possible and fails the run, never compared.)
    """
    clustered = [setup for setup in setups if len(setup.processes) > 1]
    ports = iter(free_ports(sum(len(setup.processes) for setup in clustered)))
    jobs = []
    for setup in setups:
        processes = setup.processes
        if len(processes) > 1:
            own = [next(ports) for _ in processes]
            processes = [
                dataclasses.replace(
                    worker, tf_config=cluster_config(own, worker.worker or 0)
                )
                for worker in processes
            ]
        jobs.append(list(processes))
    return jobs


def run_jobs(
    setups: Sequence[RunSetup],
    spec: _spec.WorkerSpec | Callable[[RunSetup], _spec.WorkerSpec],
    workdir: str,
    *,
    module: str = _spec.MODULE,
    base_env: dict[str, str] | None = None,
    timeout: float,
    progress: Callable[[int, int, int], None] | None = None,
    directory: Callable[[RunSetup], str] | None = None,
    prefix: Callable[[RunSetup], list[str]] | None = None,
    conversations: Callable[[RunSetup], Conversation] | None = None,
) -> list[list[RunOutcome]]:
    """Starts every process of every run at once and waits for all of them.

    A run is one process, or each worker process of a multi-worker run
    (`RunSetup.processes`, `workers` > 1), which get a
    loopback `TF_CONFIG` on free ports. When a process of a run fails or
    times out, the run's other processes are killed at once (they would
    wait for it in a collective) and reported as stopped after it.

    Args:
        setups: The runs (their `delay` staggers the starts).
        spec: The spec every process gets (its result, trace and progress
            channel are filled in per process), or a function that gives
            each run's (the settings `tfdet cost` compares).
        workdir: Where results, weights, stdout and stderr files go.
        module: The module run as `python -m module SPEC_JSON` (tests
            substitute a stand-in child).
        base_env: The environment the setups' overrides apply to.
        timeout: Seconds before a process is killed and reported as timed out
            (`RunOptions.timeout`, validated there).
        progress: Called as `progress(run_index, steps_done, steps_total)`,
            from the first process of each run.
        directory: The working directory of a process (None: this one's).
        prefix: The command a run's processes are started through (an
            overlay's launcher, `_isolation`), before its own launcher.
        conversations: The `Conversation` of each run, whose process the
            parent asks for answers while it runs (`tfdet cost`), or None:
            runs that go to their end unasked.

    Returns:
        One list of `RunOutcome`s per run, one per process, in order. Anything
        that goes wrong while starting or following a process makes it a
        failure, never a missing entry (a missing run could otherwise pass
        as "equal").
    """
    base_env = dict(os.environ if base_env is None else base_env)
    jobs = _jobs(setups)
    groups = [ProcessGroup() for _ in jobs]
    outcomes = [[_failed(s, RuntimeError("did not run")) for s in job] for job in jobs]

    def target(slot: int, member: int, setup: RunSetup) -> None:
        group = groups[slot]
        try:
            outcomes[slot][member] = _run_one(
                setup,
                module,
                spec(setup) if callable(spec) else spec,
                base_env,
                workdir,
                timeout,
                progress if member == 0 else None,
                group,
                None if directory is None else directory(setup),
                None if conversations is None else conversations(setup),
                () if prefix is None else prefix(setup),
            )
        except Exception as error:  # noqa: BLE001 - reported as a failed run
            failed = _failed(setup, error)
            if group.first_failure is not None:  # Not started: another failed.
                failed.failure = f"not started: {group.first_failure.name} failed"
            outcomes[slot][member] = failed
            group.fail(setup)
            if conversations is not None:
                # Its parent may be waiting for an answer: there is none.
                conversations(setup).ended(failed.reason or "failed")

    threads = []
    try:
        for slot, job in enumerate(jobs):
            for member, setup in enumerate(job):
                thread = threading.Thread(
                    target=target, args=(slot, member, setup), daemon=True
                )
                threads.append(thread)
                thread.start()
        for thread in threads:
            join_interruptibly(thread)
    finally:
        # On an interrupt (or any error here), no child may outlive us.
        for group in groups:
            group.stop_all()
    return outcomes


# How often the main thread wakes while it waits for the runs' threads.
JOIN_POLL_SECONDS = 0.5


def join_interruptibly(thread: threading.Thread) -> None:
    """`thread.join()`, waking every `JOIN_POLL_SECONDS`.

    Python runs a signal handler (Ctrl-C's KeyboardInterrupt) in the main
    thread, between bytecodes. An untimed join wakes for it only when the
    kernel delivered the signal to the main thread itself; a timed one
    re-checks at each wake-up, so a stop signal takes effect within the
    poll interval whichever thread received it.
    """
    while thread.is_alive():
        thread.join(JOIN_POLL_SECONDS)


def read_traces(jobs: list[list[RunOutcome]]) -> list[list[RunOutcome]]:
    """`jobs` with each ok process's trace read back (`RunOutcome.trace`).

    A process whose result names no trace keeps None; one whose trace is
    unreadable becomes a failed run that says why (never compared).
    """
    return [[_with_trace(outcome) for outcome in job] for job in jobs]


def _with_trace(outcome: RunOutcome) -> RunOutcome:
    result = outcome.result
    if not outcome.ok or not isinstance(result, CheckResult) or not result.trace:
        return outcome
    try:
        trace = _trace.read(result.trace)
    except TraceFormatError as error:
        return dataclasses.replace(
            outcome, result=None, failure=f"its trace is unreadable ({error})"
        )
    return dataclasses.replace(outcome, trace=trace)


def run_all(
    setups: Sequence[RunSetup],
    spec: _spec.WorkerSpec | Callable[[RunSetup], _spec.WorkerSpec],
    workdir: str,
    **options: Any,
) -> list[RunOutcome]:
    """`run_jobs` for runs of one process each: one `RunOutcome` per setup.

    `options` are `run_jobs`'s keyword arguments.
    """
    return [outcome for (outcome,) in run_jobs(setups, spec, workdir, **options)]
