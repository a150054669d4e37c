"""`tfdet check` end to end: fresh processes, perturbations, exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env, run_tfdet
from tfdet._runner import _outcome
from tfdet._runner._process import NEIGHBOUR_CODE

MODELS = f"{REPO / 'tests' / 'targets' / 'check_models.py'}"


def _check(*args: str, tmp_path, env=None) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    proc = run_tfdet("check", *args, "--json", str(report_path), env=env)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cnn_check(tmp_path_factory):
    """One default check of the built-in CNN that keeps its traces."""
    tmp_path = tmp_path_factory.mktemp("cnn")
    traces = tmp_path / "traces"
    return (*_check("--traces", str(traces), tmp_path=tmp_path), traces)


@pytest.fixture(scope="module")
def urandom_check(tmp_path_factory):
    """One check of a target with os.urandom noise that keeps its traces."""
    tmp_path = tmp_path_factory.mktemp("urandom")
    traces = tmp_path / "traces"
    return (
        *_check(
            f"{MODELS}:urandom_model",
            "--perturb",
            "none",
            "--steps",
            "2",
            "--traces",
            str(traces),
            tmp_path=tmp_path,
        ),
        traces,
    )


def _diff(traces, tmp_path) -> tuple[int, dict]:
    report_path = tmp_path / "diff.json"
    proc = run_tfdet(
        "diff",
        str(traces / "cpu" / "run0.jsonl"),
        str(traces / "cpu" / "run1.jsonl"),
        "--json",
        str(report_path),
    )
    return proc.returncode, json.loads(report_path.read_text())


def test_traces_of_an_identical_check_are_identical_for_tfdet_diff(cnn_check, tmp_path):
    code, report, output, traces = cnn_check
    assert code == 0, output
    assert sorted(os.listdir(traces / "cpu")) == ["run0.jsonl", "run1.jsonl"]
    runs = report["devices"]["cpu"]["runs"]
    assert [run["trace"] for run in runs] == [
        str(traces / "cpu" / "run0.jsonl"),
        str(traces / "cpu" / "run1.jsonl"),
    ]
    diff_code, diff = _diff(traces, tmp_path)
    assert diff_code == 0 and diff["identical"] and diff["steps_compared"] == 3
    assert report["exit_code"] == diff_code


def test_traces_of_a_noisy_check_differ_for_tfdet_diff_where_check_says(
    urandom_check, tmp_path
):
    code, report, output, traces = urandom_check
    assert code == 1, output
    diff_code, diff = _diff(traces, tmp_path)
    assert diff_code == 1 and not diff["identical"]
    divergence = report["devices"]["cpu"]["divergence"]
    for key in ("step", "quantity", "expected", "received", "ulps"):
        assert diff["divergence"][key] == divergence[key], key


def test_builtin_cnn_is_bit_identical_under_every_perturbation(cnn_check):
    code, report, output, _ = cnn_check
    assert code == 0, output
    cpu = report["devices"]["cpu"]
    assert report["verdict"] == cpu["verdict"] == "identical"
    assert all(run["ok"] and run["steps_recorded"] == 3 for run in cpu["runs"])
    # Each run says what it had; the baseline and the other run differ in each
    # perturbation that applies here.
    first, second = (run["perturbations"] for run in cpu["runs"])
    applied = set(cpu["perturbations"]) - set(cpu["perturbations_skipped"])
    assert {"hashseed", "neighbour", "stagger"} <= applied
    for name in applied:
        assert first[name] != second[name]
    assert report["devices"]["gpu"] == {"status": "skipped", "reason": "no GPU visible"}
    assert "GPU: skipped, no GPU visible" in output
    # The summary shows each run's final loss, the same bits in both.
    losses = {run["final_loss"] for run in cpu["runs"]}
    assert len(losses) == 1 and f"final loss {losses.pop()}" in output
    # What the runs imitated, and what no run on one machine can: an
    # IDENTICAL here is no claim about another CPU vendor or cache geometry.
    assert set(report["imitated"]) == applied
    assert {"cpu_vendor", "cache_sizes_elsewhere", "approximate_instructions"} <= set(
        report["not_imitated"]
    )
    assert "not imitated: cpu vendor" in output
    # Under enable() the ISA preset would equal the pinned cap: not applied.
    assert "isa" in cpu["perturbations_skipped"]


def test_without_tfdet_the_same_check_diverges_and_names_the_cause(tmp_path):
    code, report, output = _check("--no-enable", tmp_path=tmp_path)
    cpu = report["devices"]["cpu"]
    applied = set(cpu["perturbations"]) - set(cpu["perturbations_skipped"])
    if not applied & {"affinity", "isa", "caches"}:
        pytest.skip("no affinity, ISA or caches perturbation applies on this machine")
    assert code == 1, output
    divergence = cpu["divergence"]
    assert divergence["step"] == 0
    assert divergence["quantity"].startswith(("loss", "metric:", "weights:"))
    if "isa" in applied:  # The unpinned ISA shows in the profiles, reported first.
        assert "cpu_isa" in divergence["profile_differences"]
    attribution = divergence["attribution"]
    # The runs parted at step 0, so the re-runs stop there (of 3 steps).
    assert attribution["steps_rerun"] == 1
    same = "same bits through step 0"
    assert attribution["alone"]["none (a re-run of the baseline)"] == same
    assert set(attribution["responsible"]) <= applied & {"affinity", "isa", "caches"}
    assert attribution["responsible"], attribution
    for harmless in ("hashseed", "neighbour", "stagger"):
        assert attribution["alone"][harmless] == same
    assert "first divergence" in output and "separated by" in output
    assert re.search(r"re-running \d+ processes at once for 1 step\(s\)", output)


def test_urandom_noise_diverges_even_with_tfdet(urandom_check):
    code, report, output, _ = urandom_check
    assert code == 1, output
    divergence = report["devices"]["cpu"]["divergence"]
    assert divergence["step"] == 0 and divergence["quantity"] == "loss"
    assert divergence["ulps"] > 0
    assert "nondeterministic by itself" in divergence["attribution"]["verdict"]


@pytest.mark.parametrize(
    ("target", "legacy"),
    [
        ("builtin:keras_issue", False),
        ("builtin:keras_issue_tf_keras", True),
        ("builtin:keras_issue_tf_keras_graph", True),
    ],
)
def test_keras_issue_12724_is_bit_identical_in_three_processes(
    tmp_path, target, legacy
):
    if legacy:
        pytest.importorskip("tf_keras")
    code, report, output = _check(
        target, "--runs", "3", "--steps", "2", "--no-attribute", tmp_path=tmp_path
    )
    assert code == 0, output
    runs = report["devices"]["cpu"]["runs"]
    assert len(runs) == 3 and all(run["steps_recorded"] == 2 for run in runs)
    assert {run["profile"]["keras"] for run in runs} == {
        "tf_keras" if legacy else "keras3"
    }


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:build", "importable"),
        (f"{MODELS}:no_such_function", "no_such_function"),
        (f"{MODELS}:not_a_model", "compiled Keras model"),
        (f"{MODELS}:uncompiled_model", "compile"),
        ("builtin:nope", "built-in target"),
        ("no-colon", "TARGET"),
    ],
)
def test_bad_target_exits_2_before_any_run(tmp_path, target, message):
    # No perturbation: the runs end at the TARGET, and a default check's
    # CPU-burning neighbour would burn beside them until then.
    code, report, output = _check(target, "--perturb", "none", tmp_path=tmp_path)
    assert code == 2, output
    assert message in output
    assert "run 0" not in output and report == {}


@pytest.mark.parametrize(
    "flags",
    [
        ["--runs", "1"],
        ["--perturb", "gravity"],
        ["--device", "tpu"],
        ["--steps", "0"],
        ["--seed", "-1"],
        ["--seed", str(2**32)],
        ["--threads", "0"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--threads", "10000"],
        ["--traces", "/dev/null"],
        ["--no-enable", "--threads", "2"],
    ],
)
def test_bad_flags_exit_2(tmp_path, flags):
    code, _, output = _check(*flags, tmp_path=tmp_path)
    assert code == 2, output
    assert "Traceback" not in output and "run 0" not in output


def test_crashing_run_exits_3_with_its_stderr(tmp_path):
    code, report, output = _check(
        f"{MODELS}:crash_model", "--perturb", "none", "--steps", "1", tmp_path=tmp_path
    )
    assert code == 3, output
    cpu = report["devices"]["cpu"]
    assert cpu["verdict"] == "failed" and report["verdict"] == "failed"
    assert all(not run["ok"] for run in cpu["runs"])
    assert "boom: this layer refuses to train" in cpu["runs"][0]["stderr_tail"]
    assert "boom" in output
    assert cpu["runs"][0]["reason"] == "exited 1" and "failed (exited 1)" in output


def test_run_over_timeout_exits_3(tmp_path):
    code, report, output = _check(
        f"{MODELS}:sleepy_model",
        "--perturb",
        "none",
        # The TARGET is built in time even on a loaded machine; the runs
        # sleep in their first training step.
        "--timeout",
        "40",
        tmp_path=tmp_path,
    )
    assert code == 3, output
    assert all(run["timed_out"] for run in report["devices"]["cpu"]["runs"])
    assert "timed out" in output


def test_gpu_without_gpu_exits_4(tmp_path):
    code, _, output = _check(
        "--device", "gpu", tmp_path=tmp_path, env=clean_env(CUDA_VISIBLE_DEVICES="-1")
    )
    assert code == 4, output
    assert "no GPU visible" in output


def test_user_data_is_used(tmp_path):
    code, report, output = _check(
        f"{MODELS}:with_data",
        "--perturb",
        "hashseed",
        "--steps",
        "2",
        tmp_path=tmp_path,
    )
    assert code == 0, output
    assert report["devices"]["cpu"]["runs"][0]["steps_recorded"] == 2


def test_one_crashed_run_is_a_failure_not_a_smaller_comparison(tmp_path, two_cpus):
    code, report, output = _check(
        f"{MODELS}:crash_on_one_cpu",
        "--perturb",
        "affinity",
        "--steps",
        "1",
        tmp_path=tmp_path,
    )
    assert code == 3, output
    runs = report["devices"]["cpu"]["runs"]
    assert len(runs) == 2
    assert [run["ok"] for run in runs] == [True, False]
    assert runs[1]["returncode"] == 17
    assert "IDENTICAL" not in output


def test_unwritable_json_exits_2_before_any_run(tmp_path):
    proc = run_tfdet("check", "--json", str(tmp_path / "no" / "such" / "dir.json"))
    assert proc.returncode == 2, proc.stderr
    assert "--json" in proc.stderr and "run 0" not in proc.stderr


def test_interrupt_leaves_no_process_behind(tmp_path):
    # A unique path, also in the check's environment (`MARKER_VARIABLE`).
    marker = tmp_path / "interrupt_marker_model.py"
    marker.write_text(
        "from tests.targets.check_models import _dense_model\n"
        "def build():\n    return _dense_model()\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfdet",
            "check",
            f"{marker}:build",
            "--steps",
            "100000",
        ],
        env=clean_env(**{MARKER_VARIABLE: str(marker)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until both runs train (and the neighbour burns), then interrupt.
    seen = set()
    for line in proc.stderr:
        if ": step " in line:  # A run's progress line, not the header
            seen.add(line.split(":")[0])
        if len(seen) == 2:
            break
    # The matcher must see this check's processes while they live, or the
    # "no survivors" assertion below could never fail.
    alive = _children_of_this_check(marker, proc.pid)
    assert sum(NEIGHBOUR_CODE not in argv for argv in alive) == 2, alive
    assert sum(NEIGHBOUR_CODE in argv for argv in alive) == 1, alive
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    time.sleep(1)
    assert _children_of_this_check(marker, proc.pid) == []


# Set in a check's environment by a test that looks for the check's processes:
# its runs and neighbour inherit it, another test's concurrent check (pytest
# workers run tests side by side) does not have it.
MARKER_VARIABLE = "TFDET_TEST_CHECK_MARKER"


def _children_of_this_check(marker, check_pid: int) -> list[list[str]]:
    """Argument vectors of the processes the check started with `marker` in
    its environment (`MARKER_VARIABLE`) runs: its runs and its neighbour,
    alive or orphaned, and no process of another check or of the CI harness."""
    wanted = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for pid, argv in _argvs().items():
        if pid == check_pid or argv[:1] != [sys.executable]:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environment = handle.read().split(b"\0")
        except OSError:
            continue
        if wanted in environment:
            found.append(argv)
    return found


def _argvs() -> dict[int, list[str]]:
    """The argument vector of every process on the machine, by pid, from /proc."""
    argvs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue
            argvs[int(entry)] = raw.decode(errors="replace").split("\0")[:-1]
    return argvs


def test_module_target_from_the_working_directory_with_the_console_script(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "tfdet")
    if not os.path.exists(script):
        pytest.skip("the tfdet console script is not installed next to this Python")
    (tmp_path / "my_cwd_target.py").write_text(
        "import keras\n"
        "def build():\n"
        "    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    return model\n"
    )
    proc = subprocess.run(
        [script, "check", "my_cwd_target:build", "--perturb", "none", "--steps", "1"],
        env=clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _fake_report(losses=("0.5", "0.5"), nonfinite=()):
    """A typed report of two finished runs (no process started)."""
    from tfdet._commands import _check_report, _report_common

    runs = tuple(
        _check_report.RunReport(
            facts=_report_common.ProcessFacts(
                index=index,
                worker=None,
                name=f"run {index}",
                perturbations={},
                ok=True,
                reason=None,
                returncode=0,
                timed_out=False,
                seconds=1.0,
            ),
            training=_check_report.Training(
                profile={},
                steps_recorded=3,
                final_loss=loss,
                nonfinite=tuple(nonfinite),
                trace=f"run{index}.jsonl",
            ),
        )
        for index, loss in enumerate(losses)
    )
    return _check_report.CheckReport(
        target="builtin:cnn",
        enable=True,
        seed=0,
        threads=1,
        patches=("auto",),
        runs_per_device=2,
        steps=3,
        workers=1,
        replicas=1,
        traces=None,
        devices={
            "cpu": _check_report.DeviceReport(status="ran", runs=runs, exit_code=0)
        },
        imitated={},
        varied={},
        not_imitated={},
        emulated={},
        exit_code=0,
    )


def test_identical_nan_losses_are_not_reported_without_a_word():
    from tfdet._cli import _check_text

    text = _check_text.format_report(
        _fake_report(("nan", "nan"), nonfinite=["loss nan from step 1"])
    )
    assert "final loss nan" in text
    assert "not finite: loss nan from step 1" in text
    assert "NaN or Inf" in text
    assert "NaN" not in _check_text.format_report(_fake_report())


_VERDICT_CODES = {"identical": 0, "diverged": 1, "failed": 3}
# The control's sentence for each (tfdet's verdict, the control's): what it
# must say, and what it must not.
_CONTROL_SENTENCES = {
    ("identical", "diverged"): ("so tfdet is what made these runs identical", "too"),
    ("diverged", "diverged"): ("as these runs do with tfdet", "identical"),
    ("failed", "diverged"): ("whether tfdet keeps them identical is not known", "made"),
    ("identical", "identical"): ("identical too", "tfdet diverged"),
    # Plain TensorFlow identical where tfdet diverged is no "identical too":
    # the kernels tfdet's settings choose follow the perturbations.
    ("diverged", "identical"): ("where these runs with tfdet diverged", "too"),
    ("failed", "identical"): ("with tfdet failed, so nothing was compared", "too"),
    ("identical", "failed"): ("a run failed, so nothing was compared", "identical"),
    ("diverged", "failed"): ("a run failed, so nothing was compared", "identical"),
    ("failed", "failed"): ("a run failed, so nothing was compared", "identical"),
}


def _controlled_report(verdict, control, imitated=None, patches=("auto",)):
    """`_fake_report` with tfdet's verdict and a control's (no process)."""
    import dataclasses

    from tfdet._commands._report_common import Control

    report = _fake_report()
    code = _VERDICT_CODES[verdict]
    return dataclasses.replace(
        report,
        exit_code=code,
        devices={"cpu": dataclasses.replace(report.devices["cpu"], exit_code=code)},
        imitated=imitated or {},
        patches=patches,
        control=Control(
            verdict=control,
            exit_code=_VERDICT_CODES[control],
            divergence="Bits diverged at step 0" if control == "diverged" else None,
        ),
    )


@pytest.mark.parametrize(("verdict", "control"), sorted(_CONTROL_SENTENCES))
def test_the_control_sentence_fits_both_verdicts(verdict, control):
    from tfdet._cli import _check_text

    said, unsaid = _CONTROL_SENTENCES[verdict, control]
    report = _controlled_report(verdict, control)
    for text in (_check_text.format_report(report), str(report)):
        (line,) = [line for line in text.splitlines() if "control without" in line]
        assert said in line and unsaid not in line, line
        assert "pool_size_free_products" not in line, line


def test_a_batch_divergence_plain_tensorflow_does_not_have_names_the_patch():
    # Under enable() (oneDNN capped at AVX2) a Dense model's predictions
    # for a batch of 16 differed from a batch of 1; plain TensorFlow's
    # (AVX-512) did not. The control line said "identical too ... proves
    # little".
    from tfdet._cli import _check_text, as_flags

    batch = {"batch": "predicted its inputs in another order"}
    left_out = ("auto", "-pool_size_free_products")
    report = _controlled_report("diverged", "identical", batch, left_out)
    text = _check_text.format_report(report)
    assert "oneDNN ISA cap" in text and "identical too" not in text, text
    # The library names the option as Python does; the CLI as its flag.
    assert "the default `patches=auto`" in text, text
    assert "the default --patches auto" in as_flags(text), text
    assert "batch-invariant predictions" in str(report)
    # Under the patch (the default), or another perturbation: no such advice.
    for other in (
        _controlled_report("diverged", "identical", imitated=batch),
        _controlled_report("diverged", "identical", imitated={"hashseed": "x"}),
    ):
        assert "batch-invariant" not in _check_text.format_report(other)


def test_json_is_written_before_the_report_and_a_closed_stdout_is_harmless(
    tmp_path, monkeypatch
):
    import argparse

    from tfdet._cli import check as cli_check
    from tfdet._commands import _check as runs_check

    report = _fake_report()
    monkeypatch.setattr(
        runs_check, "check", lambda options, progress=None, on_step=None: report
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # Nobody reads: printing raises BrokenPipeError.
    stdout = os.fdopen(os.dup(write_end), "w")
    os.close(write_end)
    monkeypatch.setattr(sys, "stdout", stdout)
    path = tmp_path / "report.json"
    args = argparse.Namespace(
        target=None,
        steps=3,
        perturb="none",
        enable=True,
        seed=0,
        threads=1,
        patches="auto",
        timeout=600.0,
        runs=2,
        device="cpu",
        attribute=True,
        control=False,
        traces=None,
        workers=1,
        replicas=1,
        emulate_cpu=None,
        json=str(path),
    )
    assert cli_check.execute(args) == 0
    assert json.loads(path.read_text())["verdict"] == "identical"
    stdout.close()


# `tfdet.check()` and `tfdet check` run the same library, which names options
# the Python way (`workers`); the CLI says them as its flags (`as_flags`).
# These reasons and this error used to say `--workers` and `--timeout` to a
# Python caller too.


def test_skipped_reasons_name_parameters_in_python_and_flags_in_the_cli(
    monkeypatch, capsys
):
    import dataclasses

    import tfdet
    from tfdet._cli import main
    from tfdet._commands import _check as runs_check
    from tfdet._protocol import _spec

    def ran(device, options, progress, workdir, step=None):
        # No process: a finished device with the real plan's skipped reasons.
        return dataclasses.replace(
            _fake_report().devices["cpu"],
            perturbations=options.perturb,
            perturbations_skipped=options.plan(_spec.CHECK, device).skipped,
        )

    monkeypatch.setattr(runs_check, "_check_device", ran)
    monkeypatch.setattr(runs_check._devices, "gpu_visible", lambda: True)
    report = tfdet.check(workers=2, perturb="interrupt,batch", steps=2).to_dict()
    assert report["devices"]["gpu"]["reason"] == (
        "`workers` and `replicas` are checked on the CPU only"
    )
    assert report["devices"]["cpu"]["perturbations_skipped"] == {
        "interrupt": "not for `workers` or `replicas`: tf.distribute resumes "
        "its own way",
        "batch": "not for `workers` or `replicas`",
    }
    flags = ["--workers", "2", "--perturb", "interrupt,batch", "--steps", "2"]
    assert main(["tfdet", "check", *flags]) == 0
    out = capsys.readouterr().out
    assert "GPU: skipped, --workers and --replicas are checked on the CPU only" in out
    assert "interrupt not applied: not for --workers or --replicas: tf." in out
    assert "batch not applied: not for --workers or --replicas\n" in out
    assert "`workers`" not in out


def test_a_target_building_past_the_timeout_names_timeout_then_the_flag(
    monkeypatch, capsys
):
    import tfdet
    from tfdet._cli import main
    from tfdet._commands import _check as runs_check
    from tfdet._protocol import _spec
    from tfdet._runner import _spawn

    def still_building(setups, spec, workdir, *, timeout, **kwargs):
        # No process: every run was stopped at the timeout, still building.
        return [
            [
                _outcome.RunOutcome(
                    setup=setup,
                    returncode=None,
                    result=None,
                    stderr_tail="",
                    timed_out=True,
                    seconds=timeout,
                    stage=_spec.BUILDING,
                )
            ]
            for setup in setups
        ]

    monkeypatch.setattr(_spawn, "run_jobs", still_building)
    monkeypatch.setattr(runs_check._devices, "gpu_visible", lambda: False)
    with pytest.raises(tfdet.RunFailedError) as error:
        tfdet.check(timeout=5, perturb="none", device="cpu")
    message = str(error.value)
    assert "to be built within `timeout=5` seconds." in message
    assert "Raise `timeout`, or" in message and "--" not in message
    assert main(["tfdet", "check", "--timeout", "5", "--perturb", "none"]) == 3
    err = capsys.readouterr().err
    assert "to be built within --timeout 5 seconds." in err
    assert "Raise --timeout, or" in err


def test_progress_never_raises(monkeypatch):
    from tfdet._cli import _training_flags

    class Closed:
        def write(self, text):
            raise BrokenPipeError("closed")

        def flush(self):
            raise BrokenPipeError("closed")

        def fileno(self):
            raise OSError("no descriptor")

    monkeypatch.setattr(sys, "stderr", Closed())
    _training_flags.progress("run 0: step 1/3")  # no exception


def test_attribution_reruns_stop_at_the_step_where_runs_parted():
    from tfdet._commands import _check
    from tfdet._record._diff import Divergence

    assert _check._through_step(Divergence(2, 0, "loss", "a", "b")) == 2
    assert (
        _check._through_step(Divergence(1, 0, "weights:0:dense/kernel", "a", "b")) == 1
    )
    # Seen only in the final weights, or a step missing: every step is needed.
    assert (
        _check._through_step(Divergence(2, 0, "final weights:dense/kernel", "a", "b"))
        is None
    )
    assert _check._through_step(Divergence(2, 0, "steps", "a", "b")) is None


@pytest.mark.slow
def test_the_control_says_whether_the_perturbations_separate_plain_tensorflow(
    tmp_path, two_cpus
):
    # Where the perturbations separate plain TensorFlow (the pool size that
    # follows the CPUs a run may use), identical proves tfdet's work; where
    # they do not (the hash seed, a delayed start), it proves little.
    common = ("--device", "cpu", "--steps", "2", "--no-attribute", "--control")
    code, report, output = _check(*common, "--perturb", "affinity", tmp_path=tmp_path)
    assert code == 0, output
    assert report["control"]["verdict"] == "diverged"
    assert "so tfdet is what made these runs identical" in output
    code, report, output = _check(
        *common, "--perturb", "hashseed,stagger", tmp_path=tmp_path
    )
    assert code == 0, output
    assert report["control"] == {
        "verdict": "identical",
        "exit_code": 0,
        "divergence": None,
    }
    assert "an identical verdict proves little here" in output


def test_a_control_without_tfdet_is_a_usage_error(tmp_path):
    code, _, output = _check("--no-enable", "--control", tmp_path=tmp_path)
    assert code == 2 and "control" in output
