"""Nothing a training script or an unusual input does can fake a verdict.

Each test is one way a user's script or command used to get a false verdict,
a wrong exit code, or tfdet's own error in front of the user's: isolated
script runs (their own working directory, result and progress channels, and
end), zero steps, the script's real Keras choice, a custom `train_step`
under `locate`, flags that do not go together, and thread pools changed
behind `enable()`'s back.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_tfdet
from tfdet._errors import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, TargetError

SCRIPTS = REPO / "tests" / "targets" / "scripts"
LOCATE_MODELS = REPO / "tests" / "targets" / "locate_models.py"


def _check_script(tmp_path, script: str, *args: str) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    # From a directory of the user's, with the script in it (a copy).
    project = tmp_path / "project"
    project.mkdir()
    (project / script).write_text((SCRIPTS / script).read_text())
    proc = run_tfdet(
        "check",
        "--script",
        script,
        "--json",
        str(report_path),
        *args,
        cwd=project,
    )
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.slow
def test_checkpoints_on_relative_paths_stay_in_each_runs_own_directory(tmp_path):
    # BackupAndRestore("bk") and ModelCheckpoint("ckpt.weights.h5"): shared,
    # run 1 restored run 0's backup (a false divergence) or HDF5 refused to
    # open one file twice.
    code, report, output = _check_script(
        tmp_path, "checkpoints_relative.py", "--runs", "3"
    )
    assert code == EXIT_OK, output
    assert [run["steps_recorded"] for run in report["run_reports"]] == [12, 12, 12]
    # Nothing was written where the check was started.
    assert sorted(p.name for p in (tmp_path / "project").iterdir()) == [
        "checkpoints_relative.py"
    ]


@pytest.mark.slow
def test_helpers_forks_and_a_closed_stdout_do_not_decide_the_verdict(tmp_path):
    # A helper never waited for (the run used to wait for it to close
    # stdout), a forked child exiting 0 (it used to overwrite the result),
    # stdout sent to a file and closed (tfdet's progress went there).
    code, report, output = _check_script(
        tmp_path, "unruly_process.py", "--perturb", "none"
    )
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["steps_recorded"] == 2
        assert run["seconds"] < 100  # Not the helper's 120 s sleep.


@pytest.mark.slow
def test_a_fit_of_zero_steps_trained_nothing(tmp_path):
    code, report, output = _check_script(
        tmp_path, "trains_zero_steps.py", "--perturb", "none"
    )
    assert code == EXIT_RUN_FAILED, output
    assert report["nothing_trained"] is True
    assert "trained nothing" in output


@pytest.mark.slow
def test_a_commented_out_keras_choice_is_not_the_scripts_choice(tmp_path):
    code, report, output = _check_script(
        tmp_path, "commented_legacy_keras.py", "--perturb", "none"
    )
    assert code == EXIT_OK, output
    assert [run["keras"] for run in report["run_reports"]] == [["Keras 3"]] * 2
    assert "Keras 3" in output


@pytest.mark.slow
def test_a_fit_that_raises_early_shows_the_users_error_alone(tmp_path):
    code, report, output = _check_script(
        tmp_path, "fit_raises_early.py", "--perturb", "none"
    )
    assert code == EXIT_RUN_FAILED, output
    tail = report["run_reports"][0]["stderr_tail"]
    assert tail.startswith("Traceback (most recent call last):")
    assert "ValueError" in tail
    assert "_writer" not in output and "AttributeError" not in output


@pytest.mark.slow
@pytest.mark.parametrize(("pool", "code"), [("1", EXIT_OK), ("4", EXIT_USAGE)])
def test_thread_pools_changed_behind_enable_are_refused(pool, code):
    # tfdet run pins one thread; the script asks for `pool`: it used to get
    # 4 compute threads while the profile and traces said 1.
    proc = run_tfdet(
        "run", "--threads", "1", str(SCRIPTS / "sets_thread_pools.py"), pool
    )
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        assert "asks for threads=4 but tfdet run pinned threads 1" in proc.stderr
        assert "--threads 4" in proc.stderr
    else:
        assert "pool 1" in proc.stdout


@pytest.mark.slow
def test_locate_refuses_a_model_with_its_own_train_step(tmp_path):
    # It used to replay Keras's step instead and find "no difference".
    proc = run_tfdet("locate", f"{LOCATE_MODELS}:custom_train_step", "--steps", "1")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "overrides train_step" in proc.stderr
    assert "tfdet check" in proc.stderr


@pytest.mark.parametrize(
    "flags",
    [
        ["--workers", "2"],
        ["--replicas", "2"],
    ],
)
def test_script_with_a_distribution_flag_is_a_usage_error(flags):
    proc = run_tfdet("check", "--script", str(SCRIPTS / "raises.py"), *flags)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "--workers or --replicas" in proc.stderr


def test_a_target_and_a_script_together_are_a_usage_error():
    proc = run_tfdet("check", "builtin:cnn", "--script", str(SCRIPTS / "raises.py"))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "a TARGET or --script, not both" in proc.stderr


def test_an_unwritable_record_is_a_usage_error_before_any_run(tmp_path):
    path = tmp_path / "no-such-directory" / "record.jsonl"
    proc = run_tfdet("locate", "--record", str(path))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "--record" in proc.stderr
    assert "starting TensorFlow" not in proc.stderr


def test_a_class_of_main_read_by_the_target_gets_advice_not_a_run():
    import tfdet

    # What a notebook cell makes: a class and a function of `__main__`.
    namespace = {"__name__": "__main__"}
    exec(  # noqa: S102 - a notebook cell, stood in for
        "class MyLayer:\n    pass\n\ndef build():\n    return MyLayer()\n",
        namespace,
    )
    with pytest.raises(TargetError, match="Move it into a module file"):
        tfdet.check(namespace["build"])


@pytest.mark.slow
def test_a_projects_layout_reads_its_siblings_and_keeps_its_outputs_own(tmp_path):
    # code/ reads ../data (the mirror's parent used to be tfdet's temporary
    # directory: every run failed), writes into out/ -> a scratch directory
    # (linked whole: the runs wrote into one directory, HDF5 refused to open
    # a file twice), and holds a FIFO (copied: tfdet's internal error).
    import os

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "values.txt").write_text(
        "\n".join(str(i / 64) for i in range(64))
    )
    scratch = tmp_path / "scratch" / "out"
    scratch.mkdir(parents=True)
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text((SCRIPTS / "project_layout.py").read_text())
    (code_dir / "out").symlink_to(scratch)
    os.mkfifo(code_dir / "pipe")
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", "--script", "train.py", "--runs", "3", "--json", str(report_path),
        cwd=code_dir,
    )  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert [run["steps_recorded"] for run in report["run_reports"]] == [8, 8, 8]
    assert list(scratch.iterdir()) == []  # Each run wrote its own out/.
    assert sorted(p.name for p in code_dir.iterdir()) == ["out", "pipe", "train.py"]


@pytest.mark.slow
def test_a_change_to_a_linked_file_fails_the_check_naming_it_and_who_may_have(
    tmp_path,
):
    # With copies (`--copies`, or where Linux gives no overlay), a large file
    # is linked, not copied: appending to it from the script (or from
    # another job, which tfdet cannot tell apart) is shared by the runs. The
    # report names the file and says both possible writers. In an overlay
    # (the default where Linux allows one), the append is each run's own and
    # the user's file keeps its bytes.
    project = tmp_path / "project"
    project.mkdir()
    (project / "big.log").write_bytes(b"x" * (2 << 20))
    (project / "train.py").write_text(
        (SCRIPTS / "no_backup_fit.py").read_text()
        + "\nwith open('big.log', 'a') as log:\n    log.write('trained\\n')\n"
    )
    proc = run_tfdet(
        "check", "--script", "train.py", "--perturb", "none", "--copies", cwd=project
    )
    assert proc.returncode == EXIT_RUN_FAILED, proc.stdout + proc.stderr
    assert "big.log" in proc.stdout and "changed while they ran" in proc.stdout
    assert "or another process did" in proc.stdout
    (project / "big.log").write_bytes(b"x" * (2 << 20))
    proc = run_tfdet("check", "--script", "train.py", "--perturb", "none", cwd=project)
    if "overlays of its own" in proc.stdout:
        assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
        assert (project / "big.log").read_bytes() == b"x" * (2 << 20)
    else:  # No overlay here: copies, as above.
        assert proc.returncode == EXIT_RUN_FAILED, proc.stdout + proc.stderr
