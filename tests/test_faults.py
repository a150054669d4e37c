"""No false verdicts under faults: signals, closed or unread pipes, TARGETs
that exit or hang.

Each test spawns `tfdet` as the user would and waits on conditions (a
progress line, bytes in a pipe, a process appearing), never on sleeps, with
generous deadlines: the machine may be loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import signal
import subprocess
import sys
import termios
import threading
import time

import pytest

from tests.conftest import REPO, clean_env, run_tfdet
from tfdet._protocol import _spec
from tfdet._runner._process import NEIGHBOUR_CODE

FAULTS = str(REPO / "tests" / "targets" / "fault_models.py")
DEADLINE = 300.0  # Seconds for any awaited condition, for a loaded machine.
# How a run's process is told apart in a listing: its spec names its kind.
WORKER = '"kind": "check"'
LOCATE_WORKER = '"kind": "locate"'


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _descendants(root: int) -> dict[tuple[int, int], list[str]]:
    """Every live descendant of `root`, as {(pid, start time): argv}.

    Found through parent links, so only processes this tfdet started count,
    not another test's runs on the same machine. The start time tells a
    process from a later one that reuses its pid.
    """
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) and stat[0] != "Z":
            children.setdefault(stat[1], []).append((int(entry), stat[2]))
    found, todo = {}, [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            found[(pid, started)] = _argv(pid)
            todo.append(pid)
    return found


def _alive(processes) -> list[list[str]]:
    """Those of `processes` ({(pid, start time): argv}) still running."""
    return [
        argv
        for (pid, started), argv in processes.items()
        if (stat := _stat(pid)) is not None and stat[2] == started and stat[0] != "Z"
    ]


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)  # A polling interval, not a wait for an outcome.
    raise AssertionError(f"timed out waiting for {what}")


def _runs_and_neighbour(pid: int, module: str, processes: int = 2):
    """The descendants once `processes` processes of `module` (two runs, or
    every worker of two jobs) and the neighbour are alive."""

    def ready():
        found = _descendants(pid)
        argvs = list(found.values())
        runs = sum(any(module in arg for arg in argv) for argv in argvs)
        neighbours = sum(NEIGHBOUR_CODE in argv for argv in argvs)
        return found if runs == processes and neighbours == 1 else None

    return _wait_for(ready, f"{processes} {module} processes and a neighbour")


def _drain(stream, lines: queue.Queue) -> threading.Thread:
    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait_for_steps(lines: queue.Queue, runs: int = 2) -> None:
    """Until each of `runs` runs reported a training step on stderr."""
    seen, deadline = set(), time.monotonic() + DEADLINE
    while len(seen) < runs:
        line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
        assert line is not None, "tfdet ended before its runs trained"
        if ": step " in line:  # A run's progress line, not the header
            seen.add(line.split(":")[0])


def _spawn(*args: str, **kwargs) -> subprocess.Popen:
    # The fault handler prints every thread's stack on SIGABRT: what a hung
    # tfdet was waiting on (`_exit_code`).
    return subprocess.Popen(
        [sys.executable, "-m", "tfdet", *args],
        env=clean_env(PYTHONFAULTHANDLER="1"),
        **kwargs,
    )


def _exit_code(proc: subprocess.Popen, lines: queue.Queue | None = None) -> int:
    """`proc`'s exit code; if it hangs, fails with its threads' stacks.

    `lines` is its drained stderr (`_drain`), or None when nobody read it
    (`proc.stderr` is then read here).
    """
    try:
        return proc.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=60)
    if lines is None:
        os.set_blocking(proc.stderr.fileno(), False)
        dump = (proc.stderr.read() or b"").decode("utf-8", "replace")
    else:
        drained = []
        with contextlib.suppress(queue.Empty):
            while (line := lines.get(timeout=5)) is not None:
                drained.append(line)
        dump = "".join(drained)
    pytest.fail(f"tfdet did not exit in {DEADLINE:.0f} s; its threads:\n{dump[-8000:]}")


def _kill_all(proc: subprocess.Popen, processes) -> None:
    """Test cleanup: nothing this test started may outlive it, pass or fail."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for (pid, started), _ in (processes or {}).items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("command", "module", "processes", "signum"),
    [
        (["check"], WORKER, 2, signal.SIGTERM),
        (["locate"], LOCATE_WORKER, 2, signal.SIGHUP),
        # Two 2-worker jobs (one worker beside the neighbour): each worker
        # waits on its peer in every all-reduce, so one left behind would
        # wait forever. Ctrl-C.
        (["check", "--workers", "2"], WORKER, 4, signal.SIGINT),
    ],
    ids=["check-sigterm", "locate-sighup", "check-workers-ctrl-c"],
)
def test_a_stop_signal_ends_every_process_and_exits_128_plus_n(
    command, module, processes, signum
):
    proc = _spawn(
        *command,
        f"{FAULTS}:good",
        "--steps",
        "100000",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = None
    try:
        lines: queue.Queue = queue.Queue()
        _drain(proc.stderr, lines)
        _wait_for_steps(lines)
        # Both runs train and the neighbour burns: the processes that
        # `timeout` or `kill` used to leave behind.
        started = _runs_and_neighbour(proc.pid, module, processes)
        proc.send_signal(signum)
        assert _exit_code(proc, lines) == 128 + signum
        _wait_for(lambda: not _alive(started), "tfdet's children to end")
    finally:
        _kill_all(proc, started)


def test_sigint_with_stderr_never_read_exits_130():
    # Nobody reads stderr: progress lines fill the pipe. Ctrl-C must still
    # end tfdet and its runs, instead of blocking on a write forever.
    proc = _spawn(
        "check",
        f"{FAULTS}:good",
        "--steps",
        "100000",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    processes = None
    try:

        def pending() -> int:
            size = bytearray(4)
            fcntl.ioctl(proc.stderr.fileno(), termios.FIONREAD, size)
            return int.from_bytes(size, sys.byteorder)

        # Into a pipe, check writes a tenth of the steps' lines (so a full
        # pipe takes far longer than a test); the runs train, nothing reads
        # what check wrote (at least its header) when Ctrl-C comes.
        # `tests/test_cli.py` covers a full pipe at the write itself.
        processes = _runs_and_neighbour(proc.pid, WORKER)
        _wait_for(lambda: pending() > 0, "tfdet to write to stderr")
        proc.send_signal(signal.SIGINT)
        assert _exit_code(proc) == 130
        _wait_for(lambda: not _alive(processes), "tfdet's children to end")
    finally:
        _kill_all(proc, processes)
        proc.stderr.close()


CHEAP_CHECK = ("check", f"{FAULTS}:good", "--steps", "2", "--no-attribute")


def test_a_reader_that_goes_away_does_not_change_the_verdict():
    # `tfdet check 2>&1 | head -3`: the reader leaves after three lines.
    proc = _spawn(*CHEAP_CHECK, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(3):
            assert proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        _kill_all(proc, None)


def test_closed_stdout_and_stderr_pipes_do_not_change_the_verdict(tmp_path):
    # `tfdet check | true` and `2>&1 >/dev/null | true`: every write to
    # either stream fails with EPIPE (BrokenPipeError), progress lines too.
    report = tmp_path / "report.json"
    pipes = [os.pipe(), os.pipe()]
    for read_end, _ in pipes:
        os.close(read_end)  # The readers went away before tfdet wrote.
    try:
        proc = _spawn(
            *CHEAP_CHECK, "--json", str(report), stdout=pipes[0][1], stderr=pipes[1][1]
        )
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    try:
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        _kill_all(proc, None)
    result = json.loads(report.read_text())
    assert result["verdict"] == "identical"
    assert all(run["ok"] for run in result["devices"]["cpu"]["runs"])


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("check", f"{FAULTS}:os_exits_zero"),
            2,
            "ended (exit status 0) before the function returned",
        ),
        (
            ("scan", f"{FAULTS}:exits_zero"),
            2,
            "called sys.exit(0) while being built",
        ),
        (
            ("locate", f"{FAULTS}:hangs", "--timeout", "5"),
            3,
            "to be built within --timeout 5 seconds",
        ),
    ],
)
def test_a_target_that_exits_or_hangs_is_never_a_verdict(args, code, message):
    proc = run_tfdet(*args, timeout=DEADLINE)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "run 0" not in proc.stderr + proc.stdout


def test_a_failed_runs_stderr_tail_shows_the_failure_not_the_hash_seed_warning(
    tmp_path,
):
    # The worker of a run whose PYTHONHASHSEED was perturbed, as check starts it.
    spec = _spec.WorkerSpec(
        _spec.CHECK,
        target=f"{REPO / 'tests' / 'targets' / 'check_models.py'}:crash_model",
        seed=0,
        steps=1,
        enable=True,
        threads=1,
        cpu_isa="AVX2",
        result=str(tmp_path / "run.json"),
    )
    proc = subprocess.run(
        [sys.executable, "-m", _spec.MODULE, spec.to_json()],
        env=clean_env(PYTHONHASHSEED="7920"),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert proc.returncode != 0
    assert "boom: this layer refuses to train" in proc.stderr
    assert "PYTHONHASHSEED" not in proc.stderr
