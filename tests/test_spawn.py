"""`_spawn`: fresh processes, their outcomes and the reasons they failed.

The children here are a tiny module without TensorFlow, so these tests are
fast; `tests/test_check.py` spawns the real workers.
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time

import pytest

from tests.conftest import clean_env
from tfdet._commands import _options, _progress_lines
from tfdet._protocol import _perturb, _spec
from tfdet._runner import _process, _progress, _spawn
from tfdet._target import _load

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    spec = json.loads(sys.argv[1])
    mode = spec["target"]
    if mode != "neighbour":
        os.write(spec["progress_fd"], b"1 1\\n")
    if mode == "result":  # A preflight child's result: nothing of its own.
        with open(spec["result"] + ".seen", "w") as out:
            json.dump({"trace": spec["trace"]}, out)
        with open(spec["result"], "w") as out:
            json.dump({}, out)
    elif mode == "partial":  # A check's result that lacks what it must say.
        with open(spec["result"], "w") as out:
            json.dump({"trace": spec["trace"], "profile": {}}, out)
    elif mode == "garbage":
        with open(spec["result"], "w") as out:
            out.write("{not json")
    elif mode == "exit":
        sys.exit(5)
    elif mode == "hang":
        threading.Event().wait()
    elif mode == "answer":
        # tfdet cost's kind of run: answers each request until the last.
        requests = os.fdopen(spec["requests_fd"])
        for line in requests:
            answer = {"echo": json.loads(line), "stdin": sys.stdin.read()}
            os.write(spec["progress_fd"], (json.dumps(answer) + "\\n").encode())
        with open(spec["result"], "w") as out:
            json.dump({"steps": 2}, out)
    elif mode == "neighbour":
        # Whether the parent's CPU-burning neighbour runs before this run
        # says its TARGET is built, and after.
        import time
        def burning():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read()
                    with open(f"/proc/{pid}/stat") as f:
                        parent = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if parent == os.getppid() and b"cpu-burning neighbour" in argv:
                    return True
            return False
        time.sleep(1.0)  # Time for a neighbour started with the process.
        before = burning()
        os.write(spec["progress_fd"], b"built\\n")
        deadline = time.monotonic() + 30
        while not burning() and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(spec["result"] + ".seen", "w") as out:
            json.dump({"before": before, "after": burning()}, out)
        with open(spec["result"], "w") as out:
            json.dump({}, out)
    """
)


@pytest.fixture
def child(tmp_path):
    (tmp_path / "spawn_child.py").write_text(CHILD)
    return clean_env(PYTHONPATH=str(tmp_path))


def _one(child, tmp_path, mode, timeout=60.0, progress=None, kind=_spec.PREFLIGHT):
    (outcome,) = _spawn.run_all(
        [_perturb.RunSetup(0)],
        _spec.WorkerSpec(kind, target=mode),
        str(tmp_path),
        module="spawn_child",
        base_env=child,
        timeout=timeout,
        progress=progress,
    )
    return outcome


def test_a_run_that_writes_its_result_is_ok_and_gets_a_trace_path(child, tmp_path):
    outcome = _one(child, tmp_path, "result")
    assert outcome.ok and outcome.reason is None
    seen = json.loads((tmp_path / "run0.json.seen").read_text())
    assert seen["trace"] == os.path.join(tmp_path, "run0.jsonl")


def test_a_result_without_what_its_kind_must_say_is_a_failed_run(child, tmp_path):
    # Read once, into its kind's record: never a KeyError in a report later.
    outcome = _one(child, tmp_path, "partial", kind=_spec.CHECK)
    assert not outcome.ok and outcome.result is None
    assert outcome.reason == (
        "exited 0 but its result is unreadable (it lacks variables, "
        "final_weights, weights_file)"
    ), outcome.reason


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("nothing", "exited 0 without writing its result"),
        ("garbage", "exited 0 but its result is unreadable"),
        ("exit", "exited 5"),
    ],
)
def test_a_failed_run_says_why(child, tmp_path, mode, reason):
    outcome = _one(child, tmp_path, mode)
    assert not outcome.ok and outcome.reason.startswith(reason)


def test_a_run_over_its_timeout_is_killed_and_says_so(child, tmp_path):
    outcome = _one(child, tmp_path, "hang", timeout=2.0)
    assert outcome.timed_out and not outcome.ok
    assert outcome.reason.startswith("timed out after")


def test_the_neighbour_starts_when_the_run_has_built_its_target(child, tmp_path):
    # TensorFlow's start-up, before the TARGET is built, is no part of
    # training: a neighbour burning beside it only costs CPU-seconds.
    (outcome,) = _spawn.run_all(
        [_perturb.RunSetup(0, {"neighbour": _perturb.Change("", neighbour=True)})],
        _spec.WorkerSpec(_spec.PREFLIGHT, target="neighbour"),
        str(tmp_path),
        module="spawn_child",
        base_env=child,
        timeout=60.0,
    )
    assert outcome.ok, outcome.reason
    seen = json.loads((tmp_path / "run0.json.seen").read_text())
    assert seen == {"before": False, "after": True}


@pytest.mark.parametrize(
    ("line", "trains"),
    [(b"building", False), (b"built", True), (b"training", True), (b"1 5", True)],
)
def test_a_run_trains_from_its_target_built_a_scripts_first_training_or_a_step(
    line, trains
):
    called = []
    _progress.forward_progress(line, 0, None, [], on_training=lambda: called.append(1))
    assert called == ([1] if trains else [])


def test_a_scripts_run_says_it_trains_at_its_first_training_call(monkeypatch):
    from tfdet._child import _script_recorder

    told = []
    monkeypatch.setattr(_script_recorder._start, "report_stage", told.append)
    recorder = _script_recorder.Recorder("trace", None)
    recorder.entry(_script_recorder.FIT)
    recorder.entry(_script_recorder.CUSTOM)
    assert told == [_spec.TRAINING]


def test_a_progress_callback_that_raises_does_not_fail_the_run(child, tmp_path):
    called = threading.Event()

    def broken(index, done, total):
        called.set()
        raise BrokenPipeError("nobody reads stderr")

    outcome = _one(child, tmp_path, "result", progress=broken)
    assert called.is_set() and outcome.ok


def test_a_conversation_asks_its_run_over_pipes_of_its_own(child, tmp_path):
    from tfdet._errors import RunFailedError
    from tfdet._runner._conversation import Conversation

    def converse(mode, timeout=60.0):
        talk = Conversation("talking", timeout)
        done = []
        thread = threading.Thread(
            target=lambda: done.extend(
                _spawn.run_all(
                    [_perturb.RunSetup(0)],
                    _spec.WorkerSpec(_spec.COST, target=mode),
                    str(tmp_path),
                    module="spawn_child",
                    base_env=child,
                    timeout=0.5,  # A whole-life limit does not apply to it.
                    conversations=lambda setup: talk,
                )
            )
        )
        thread.start()
        return talk, thread, done

    talk, thread, done = converse("answer")
    time.sleep(1.0)  # Past the whole-life limit above: not killed.
    assert talk.ask({"steps": 2}) == {"echo": {"steps": 2}, "stdin": ""}
    assert talk.ask({"steps": 3})["echo"] == {"steps": 3}
    talk.end()
    thread.join(30)
    (outcome,) = done
    assert outcome.ok
    # A run that ends before it answers says how, at once.
    talk, thread, _ = converse("exit")
    with pytest.raises(RunFailedError, match=r"talking run ended \(exited 5\)"):
        talk.ask({"steps": 1})
    thread.join(30)
    # One that does not answer is killed after `timeout`, per answer.
    talk, thread, done = converse("hang", timeout=1.0)
    # The library names the Python parameter (the CLI says --timeout).
    with pytest.raises(
        RunFailedError, match=r"did not answer within 1 s \(`timeout`\)"
    ):
        talk.ask({"steps": 1})
    thread.join(30)
    assert done[0].timed_out


def test_worker_spec_and_environment_come_from_the_options():
    options = _options.RunOptions(
        target="builtin:cnn", steps=2, seed=7, threads=2, enable=True, workers=3
    )
    assert options.worker_spec() == _spec.WorkerSpec(
        _spec.CHECK,
        target="builtin:cnn",
        seed=7,
        steps=2,
        enable=True,
        threads=2,
        cpu_isa=options.cpu_isa,
        workers=3,
        replicas=1,
    )
    cpu = _process.run_environment(_load.TargetSpec("x:y", legacy_keras=True), "cpu")
    assert cpu["CUDA_VISIBLE_DEVICES"] == "-1" and cpu["TF_USE_LEGACY_KERAS"] == "1"
    gpu = _process.run_environment(_load.TargetSpec("x:y"), "gpu")
    assert gpu["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "TF_USE_LEGACY_KERAS" not in gpu or gpu[
        "TF_USE_LEGACY_KERAS"
    ] == os.environ.get("TF_USE_LEGACY_KERAS")


def test_gpu_runs_keep_the_cuda_jit_cache_unless_the_user_sized_it(monkeypatch):
    monkeypatch.delenv("CUDA_CACHE_MAXSIZE", raising=False)
    spec = _load.TargetSpec("x:y")
    assert _process.run_environment(spec, "gpu")["CUDA_CACHE_MAXSIZE"] == str(4 * 2**30)
    assert "CUDA_CACHE_MAXSIZE" not in _process.run_environment(spec, "cpu")
    monkeypatch.setenv("CUDA_CACHE_MAXSIZE", "1000")
    assert _process.run_environment(spec, "gpu")["CUDA_CACHE_MAXSIZE"] == "1000"


def test_the_spec_of_every_run_is_json():
    spec = _options.RunOptions().worker_spec()
    assert _spec.WorkerSpec.from_json(spec.to_json()) == spec
    assert json.loads(spec.to_json())["kind"] == "check"


@pytest.mark.parametrize(
    ("label", "total", "line"),
    [
        ("cpu", 3, "[cpu] run 1: step 2/3"),
        ("", 3, "run 1: step 2/3"),
        ("script", 0, "[script] run 1: step 2"),  # A script's total is unknown.
    ],
)
def test_step_lines_say_run_step_and_total(label, total, line):
    lines = []
    _progress_lines.step_lines(lines.append, label)(1, 2, total)
    assert lines == [line]
    assert _progress_lines.step_lines(None, label) is None


EXITING_CHILD = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    from tfdet._child import _start

    out = sys.argv[1]
    class Freed:  # Freed at the interpreter's teardown, if it runs.
        def __del__(self, path=out + ".teardown", open_=os.open, close=os.close,
                    flags=os.O_CREAT | os.O_WRONLY):
            close(open_(path, flags))
    freed = Freed()
    atexit.register(lambda: open(out + ".atexit", "w").close())
    if sys.argv[2] == "thread":
        def late():
            time.sleep(0.5)
            open(out + ".thread", "w").close()
        threading.Thread(target=late).start()
    sys.stdout.write("unflushed")
    _start.exit_without_teardown(3)
    """
)


@pytest.mark.parametrize("mode", ["alone", "thread"])
def test_a_child_ends_without_teardown_but_with_its_exit_handlers(tmp_path, mode):
    # The teardown is what costs (1.3-2 s a TensorFlow process); the exit
    # handlers, the buffered output, the status and a thread the run left
    # running are what a user sees, and stay.
    import subprocess
    import sys

    script = tmp_path / "exiting.py"
    script.write_text(EXITING_CHILD)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(script), str(out), mode],
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed"
    assert (tmp_path / "out.atexit").exists()
    if mode == "thread":
        # Waited for, as a normal exit waits: then the teardown runs too.
        assert (tmp_path / "out.thread").exists()
    else:
        assert not (tmp_path / "out.teardown").exists()


def test_every_worker_of_every_run_gets_its_own_port(monkeypatch):
    """Ports chosen run by run could repeat across runs (a port closed after
    one run's choice is free for the next), joining two runs' clusters."""
    handed = iter([5001, 5002, 5003, 5004, 5005, 5006])
    asked = []

    def free_ports(count):
        asked.append(count)
        return [next(handed) for _ in range(count)]

    monkeypatch.setattr(_spawn, "free_ports", free_ports)
    setups = [_perturb.RunSetup(index, workers=2) for index in range(3)]
    jobs = _spawn._jobs([*setups, _perturb.RunSetup(3)])
    assert asked == [6]  # Chosen at once, all held open until all are chosen.
    clusters = [
        json.loads(process.tf_config)["cluster"]["worker"]
        for job in jobs[:3]
        for process in job[:1]
    ]
    assert clusters == [
        ["127.0.0.1:5001", "127.0.0.1:5002"],
        ["127.0.0.1:5003", "127.0.0.1:5004"],
        ["127.0.0.1:5005", "127.0.0.1:5006"],
    ]
    assert [len(job) for job in jobs] == [2, 2, 2, 1]
    assert jobs[3][0].tf_config is None
