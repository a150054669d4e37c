"""Spawning fresh training processes, concurrently, under perturbations.

Each process is `python -m tfdet._child SPEC_JSON` (see
`tfdet._child._start`: one spec type, one start, one result and progress
protocol for every kind of run) with its own environment, CPU affinity,
start delay and optional CPU-burning neighbour. Progress lines arrive on a
pipe of their own and go to a callback; stdout and stderr go to files, the
stderr tail is kept for the report. A run ends when its own process ends:
whatever it started is stopped then (its process group), and a helper it
left holding a descriptor cannot keep the run going. A run that exits
non-zero, writes no result, exceeds the timeout or does not confirm a
perturbation it was to apply itself is a failure: it is never compared,
let alone counted as equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from tfdet import _notices
from tfdet._errors import RunFailedError, TargetError, TraceFormatError
from tfdet._protocol import _result, _spec
from tfdet._protocol._perturb import RunSetup
from tfdet._protocol._result import CheckResult, WorkerResult
from tfdet._record import _trace
from tfdet._runner._conversation import Conversation
from tfdet._target import _load

STDERR_TAIL_LINES = 25
# A failed run's traceback is kept whole up to this many lines.
TRACEBACK_LINES = 200
_TRACEBACK = "Traceback (most recent call last):"

# Called with one line of progress for the user (`tfdet check`, `tfdet locate`).
ProgressFn = Callable[[str], None]
# Called as `on_step(device, run_index, steps_done, steps_total)`.
StepFn = Callable[[str, int, int, int], None]


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


def run_environment(spec: _load.TargetSpec, device: str) -> dict[str, str]:
    """The environment the runs of TARGET on `device` start from."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if spec.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if device == "cpu":
        # Hide GPUs so that CPU runs are really on the CPU.
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    else:
        # Concurrent runs share the GPU: none may take all its memory.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        # TensorFlow wheels may ship PTX only for a new GPU (2.21: compute_90),
        # which the driver compiles at first use and caches on disk; its
        # default cache (256 MiB) can be too small to keep TensorFlow's
        # kernels, so every fresh run compiled them again. A user's own
        # setting stays.
        env.setdefault("CUDA_CACHE_MAXSIZE", str(CUDA_CACHE_MAXSIZE))
    return env


# The CUDA driver's largest JIT cache, in bytes (4 GiB).
CUDA_CACHE_MAXSIZE = 4 * 1024**3


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
        if resuming not in reasons:
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


class _ProcessGroup:
    """The processes of one run (one, or every worker of a multi-worker run).

    Each child starts in its own session (process group), so killing it also
    kills anything the TARGET spawned. The first process of the group that
    fails stops the others: the workers of a multi-worker run wait on each
    other in collectives, so one dead worker would leave the rest hanging
    until the timeout. An interrupt or an error in the parent stops every
    group, CPU-burning neighbours included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen] = []
        self.stopped = threading.Event()
        self.first_failure: RunSetup | None = None

    def start(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self.stopped.is_set():
                raise RuntimeError("tfdet: runs were stopped before this one started")
            process = subprocess.Popen(command, start_new_session=True, **kwargs)
            self._processes.append(process)
            return process

    def fail(self, setup: RunSetup) -> None:
        """Records that `setup`'s process failed (if first) and stops the rest."""
        with self._lock:
            if self.first_failure is None and not self.stopped.is_set():
                self.first_failure = setup
        self.stop_all()

    def stop_all(self) -> None:
        with self._lock:
            self.stopped.set()
            for process in self._processes:
                kill_tree(process)


def kill_tree(process: subprocess.Popen) -> None:
    """Kills a child started with `start_new_session=True` and its descendants."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# Named so that a process listing (and the no-survivors test) can tell tfdet's
# neighbour from any other busy loop on the machine.
NEIGHBOUR_CODE = "# tfdet cpu-burning neighbour\nwhile True:\n    pass"


def _burn(group: _ProcessGroup) -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return group.start(
        [sys.executable, "-c", NEIGHBOUR_CODE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class _Neighbour:
    """The CPU-burning neighbour of a run, from the moment the run trains.

    It starts when the run reports its TARGET built (a script: its first
    `fit`, `train_on_batch` or optimizer step), not with the process:
    TensorFlow's start-up, which no perturbation of training reaches, would
    only be slowed by it (about 4 CPU-seconds a run). `stop` ends it, and one
    that would start after that never does. A neighbour that could not start
    is an error `stop` raises: the run would otherwise be reported as
    perturbed.
    """

    def __init__(self, group: _ProcessGroup):
        self._group = group
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._error: OSError | None = None
        self._stopped = False

    def start(self) -> None:
        """Starts it, once (called from the thread that reads the progress)."""
        with self._lock:
            if self._process is not None or self._stopped or self._error:
                return
            try:
                self._process = _burn(self._group)
            except RuntimeError:  # The runs are being stopped.
                self._stopped = True
            except OSError as error:
                self._error = error

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            process = self._process
        if process is not None:
            kill_tree(process)
            process.wait()
        if self._error is not None:
            raise self._error


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
    starts = [k for k, line in enumerate(kept) if line.startswith(_TRACEBACK)]
    if starts and len(kept) - starts[-1] <= TRACEBACK_LINES:
        return "".join(kept[starts[-1] :])
    return "".join(kept[-lines:])


def _forward_progress(
    raw: bytes,
    index: int,
    progress: Callable[[int, int, int], None] | None,
    stages: list[str],
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> None:
    """Passes one `DONE TOTAL` line on, keeps a stage line in `stages`, and
    gives an answer line to the run's `conversation` (when it has one).

    `on_training` is called when the run says it trains: its TARGET built, a
    script's first training call, or a step done. Anything else is ignored.
    """
    line = raw.decode("utf-8", errors="replace").strip()
    if conversation is not None and line.startswith(_spec.ANSWER_START):
        conversation.received(line)
        return
    if line in _spec.STAGES:
        stages.append(line)
        if line in (_spec.BUILT, _spec.TRAINING) and on_training is not None:
            on_training()
        return
    parts = line.split()
    if len(parts) == 2 and all(part.isdigit() for part in parts):
        if on_training is not None:
            on_training()
        if progress is None:
            return
        # Progress is for people: a failure to show it (a closed stderr)
        # must not make the run a failure.
        with contextlib.suppress(Exception):
            progress(index, int(parts[0]), int(parts[1]))


def _follow_progress(
    read_fd: int,
    index: int,
    progress: Callable[[int, int, int], None] | None,
    stages: list[str],
    ended: threading.Event,
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> threading.Thread:
    """Reads the progress pipe until it closes, or `ended` is set and it is idle.

    `ended` is set when the run's own process exited: a process it started
    (or forked) may still hold the pipe open, and must not keep the run going.
    """

    def follow() -> None:
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([read_fd], [], [], 0.2)
                if not ready:
                    if ended.is_set():
                        return
                    continue
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    return
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    _forward_progress(
                        line, index, progress, stages, conversation, on_training
                    )
        finally:
            os.close(read_fd)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


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
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("kind") == _spec.TARGET_ERROR:
        return None, None, str(error.get("message"))
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
    group: _ProcessGroup,
    timeout: float,
    cwd: str | None,
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen, bool]:
    """Runs one process of a run to its end: `(process, timed out)`.

    `command` ends with the spec, whose progress descriptor is replaced by
    this process's own pipe. Output is appended to the run's files, the
    stages it reports to `stages`; `on_training` is called when it trains
    (`_forward_progress`). A run with a `conversation` also gets a
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
    cpus = set(setup.cpus) if setup.cpus else None

    def pin_affinity() -> None:  # Runs in the child before exec.
        os.sched_setaffinity(0, cpus)

    ended = threading.Event()
    follower = _follow_progress(
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
    group: _ProcessGroup,
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

    def start(process_setup: RunSetup):
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

    neighbour = _Neighbour(group) if setup.neighbour else None
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


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that are free right now.

    All are held open until all are chosen, so none repeats; another
    program could still take one before a worker binds it (the run then
    fails, it is never compared).
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_config(ports: list[int], worker: int) -> str:
    """The `TF_CONFIG` of worker `worker` of a loopback cluster on `ports`."""
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": worker},
        }
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
    groups = [_ProcessGroup() for _ in jobs]
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
    setups: Sequence[RunSetup], spec: _spec.WorkerSpec, workdir: str, **options: Any
) -> list[RunOutcome]:
    """`run_jobs` for runs of one process each: one `RunOutcome` per setup.

    `options` are `run_jobs`'s keyword arguments.
    """
    return [outcome for (outcome,) in run_jobs(setups, spec, workdir, **options)]


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
