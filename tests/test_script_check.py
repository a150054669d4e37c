"""`tfdet check --script`: a user's training script, unchanged, in fresh processes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import pytest

from tests.conftest import REPO, run_tfdet
from tfdet._commands import _script_check
from tfdet._commands._check_report import Attribution
from tfdet._commands._report_common import ProcessFacts
from tfdet._commands._script_report import (
    ScriptDivergence,
    ScriptRunReport,
    ScriptTraining,
)
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from tfdet._target import _load

SCRIPTS = REPO / "tests" / "targets" / "scripts"


def _check_script(script: str, *args: str, tmp_path) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", "--script", str(SCRIPTS / script), "--json", str(report_path), *args
    )
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.slow
def test_tf_data_pipeline_with_fit_is_identical_under_tfdet(tmp_path):
    code, report, output = _check_script(
        "tfdata_fit.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["entry_points"] == ["fit"]
        assert run["steps_recorded"] == 4  # 16 samples, batches of 4, 1 epoch
        assert run["trainings"][0]["name"] == "fit #1 (model sequential)"
        assert run["end"] == "completed"
    assert "identical across 2 runs" in output


@pytest.mark.slow
def test_tf_data_pipeline_differs_without_tfdet_naming_the_step(tmp_path):
    # The unseeded random op in the parallel map draws other noise in every
    # process without tfdet's global seed: the check must be able to fail,
    # and it names the input (each step's batch is in the trace) before the
    # loss that follows from it.
    code, report, output = _check_script(
        "tfdata_fit.py", "--perturb", "none", "--no-enable", tmp_path=tmp_path
    )
    assert code == EXIT_DIVERGED, output
    divergence = report["divergence"]
    assert divergence["training"] == "fit #1 (model sequential)"
    assert divergence["step"] == 0
    assert divergence["quantity"] == "data"
    assert "fit #1 (model sequential): Bits diverged at epoch 0, step 0, data" in output


@pytest.mark.slow
def test_custom_gradient_tape_loop_is_identical_under_tfdet(tmp_path):
    code, report, output = _check_script("custom_loop.py", tmp_path=tmp_path)
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["entry_points"] == ["custom loop (optimizer)"]
        assert run["steps_recorded"] == 4
        assert run["xla"]["on"] is False


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [("--no-enable",), ("--", "--urandom")],
    ids=["no-enable", "urandom"],
)
def test_custom_loop_diverges_without_tfdet_or_with_urandom(tmp_path, args):
    code, report, output = _check_script(
        "custom_loop.py", "--perturb", "none", *args, tmp_path=tmp_path
    )
    assert code == EXIT_DIVERGED, output
    divergence = report["divergence"]
    assert divergence["training"] == "custom loop #1 (optimizer adam)"
    assert divergence["step"] == 0
    assert divergence["quantity"].startswith("weights")
    if "--urandom" in args:
        assert report["args"] == ["--urandom"]


@pytest.mark.slow
def test_script_that_raises_is_a_failed_run_with_its_traceback(tmp_path):
    code, report, output = _check_script(
        "raises.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_RUN_FAILED, output
    assert report["verdict"] == "failed"
    for run in report["run_reports"]:
        assert run["ok"] is False
        assert run["returncode"] == 1
        tail = run["stderr_tail"]
        assert "RuntimeError: the data directory is missing" in tail
        assert 'raises.py", line 7' in tail
        # The traceback starts at the script, as under `python raises.py`.
        assert "_script_worker" not in tail
    assert "RuntimeError: the data directory is missing" in output


def test_a_run_that_fails_before_its_kill_is_not_said_to_be_resumed(tmp_path):
    # The script raises before any training: the interrupt never came, and
    # its label must say so (it said "killed (SIGKILL) ... and resumed").
    code, report, output = _check_script(
        "raises.py", "--perturb", "interrupt", tmp_path=tmp_path
    )
    assert code == EXIT_RUN_FAILED, output
    interrupted = report["run_reports"][1]
    assert interrupted["perturbations"]["interrupt"] == (
        "not applied: the run ended (exited 1) before it was killed"
    )
    assert "resumed" not in output


@pytest.mark.slow
def test_max_steps_stops_the_script_as_a_normal_end(tmp_path):
    code, report, output = _check_script(
        "custom_loop.py", "--perturb", "none", "--max-steps", "2", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["end"] == "stopped at --max-steps 2"
        assert run["steps_recorded"] == 2


@pytest.mark.slow
def test_train_on_batch_and_xla_dropped_by_determinism_are_reported(tmp_path):
    code, report, output = _check_script(
        "train_on_batch_xla.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["entry_points"] == ["train_on_batch"]
        assert run["steps_recorded"] == 3
        assert run["xla"]["on"] is False
        assert run["xla"]["dropped_by_determinism"] is True
    # Said once, not once per run.
    assert output.count("jit_compile=True was turned off by Keras") == 1


@pytest.mark.slow
def test_a_script_that_trains_nothing_is_not_identical(tmp_path):
    code, report, output = _check_script(
        "trains_nothing.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_RUN_FAILED, output
    assert report["nothing_trained"] is True
    assert "nothing was compared" in output


def test_max_steps_without_script_is_a_usage_error():
    proc = run_tfdet("check", "--max-steps", "2")
    assert proc.returncode == EXIT_USAGE
    assert "Expected --script with --max-steps" in proc.stderr


def test_missing_script_is_a_usage_error(tmp_path):
    proc = run_tfdet("check", "--script", str(tmp_path / "nope.py"))
    assert proc.returncode == EXIT_USAGE
    assert "No such file" in proc.stderr


def test_script_options_validate_max_steps():
    script = str(SCRIPTS / "raises.py")
    with pytest.raises(ValueError, match="`max_steps`"):
        _script_check.ScriptOptions(script=script, max_steps=0)
    assert _script_check.ScriptOptions(script=script, max_steps=3).max_steps == 3


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('os.environ["TF_USE_LEGACY_KERAS"] = "1"', True),
        ("os.environ['TF_USE_LEGACY_KERAS']='True'", True),
        ('os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")', True),
        ('os.environ["TF_USE_LEGACY_KERAS"] = "0"', False),
        ('print(os.environ.get("TF_USE_LEGACY_KERAS"))', False),
    ],
)
def test_sets_legacy_keras_reads_the_source(tmp_path, source, expected):
    path = tmp_path / "target.py"
    path.write_text(f"import os\n{source}\n")
    assert _load.sets_legacy_keras(str(path)) is expected
    assert _load.parse(f"{path}:build").legacy_keras is expected


@pytest.mark.slow
def test_loop_compiled_in_a_tf_function_compares_its_final_weights(tmp_path):
    # Its optimizer runs Python once, when traced: no step is recorded, the
    # final weights are still compared, and differ without tfdet.
    code, report, output = _check_script(
        "compiled_loop.py", "--perturb", "none", "--no-enable", tmp_path=tmp_path
    )
    assert code == EXIT_DIVERGED, output
    assert report["divergence"]["quantity"].startswith("final weights:")
    for run in report["run_reports"]:
        (training,) = run["trainings"]
        assert training["updates"] == 3
        assert training["steps"] == 0
        # The loop trains a keras.Sequential: its Keras is its optimizer's
        # (the report said "no Keras model").
        assert run["keras"] == ["Keras 3"]
    assert "3 updates in a tf.function" in output


@pytest.mark.slow
def test_tf_keras_script_that_picks_its_keras_is_recorded(tmp_path):
    # The script asserts it got tf_keras, as under `python`: tfdet reads its
    # TF_USE_LEGACY_KERAS assignment and sets it in the runs' environment.
    code, report, output = _check_script(
        "tf_keras_fit.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    for run in report["run_reports"]:
        assert run["entry_points"] == ["fit", "custom loop (optimizer)"]
        assert [t["steps"] for t in run["trainings"]] == [2, 2]


@pytest.mark.slow
def test_a_script_that_reloads_its_best_checkpoint_and_evaluates_it(tmp_path):
    # Keras compiles a loaded model only when `compile` is Keras's own: the
    # runs' XLA bookkeeping once wrapped keras.Model.compile, and the reload
    # came back uncompiled ("No loss to compute") in every run.
    code, report, output = _check_script(
        "best_checkpoint_reload.py", "--perturb", "none", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    assert all(run["ok"] for run in report["run_reports"]), output


@pytest.mark.slow
def test_an_absolute_backup_dir_is_each_runs_own(tmp_path):
    # Keras's own example, BackupAndRestore(backup_dir="/tmp/backup"): the
    # runs start together, so one resumed from another's backup and trained
    # fewer steps, a false "diverged". Each run now gets its own copy.
    shared = tmp_path / "shared-backup"  # Absolute, outside the working dir.
    workdir = tmp_path / "project"
    workdir.mkdir()
    proc = run_tfdet(
        "check", "--script", str(SCRIPTS / "absolute_backup_dir.py"),
        "--runs", "3", "--json", str(tmp_path / "report.json"), "--", str(shared),
        cwd=workdir,
    )  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert all(run["steps_recorded"] == 24 for run in report["run_reports"])
    assert not shared.exists()  # The user's path was never written.
    assert any(str(shared) in notice for notice in report["notices"])


@pytest.mark.slow
def test_a_script_divergence_names_its_cause(tmp_path):
    # As a TARGET's check does: each perturbation of the diverging run
    # alone, re-run against the baseline. Before, only "diverged at step 0".
    code, report, output = _check_script(
        "set_order_vocabulary.py", "--perturb", "hashseed,neighbour", tmp_path=tmp_path
    )
    assert code == EXIT_DIVERGED, output
    attribution = report["divergence"]["attribution"]
    assert attribution["responsible"] == ["hashseed"]
    assert attribution["alone"]["re-run"] == "same bits"
    assert "cause: separated by hashseed" in output


@pytest.mark.slow
def test_a_script_checks_control_runs_it_without_tfdet(tmp_path):
    # No seed anywhere in the script: without tfdet its runs differ, so the
    # identical verdict with tfdet is tfdet's doing, and the report says so.
    code, report, output = _check_script(
        "tfdata_fit.py", "--perturb", "none", "--control", tmp_path=tmp_path
    )
    assert code == EXIT_OK, output
    assert report["control"]["verdict"] == "diverged"
    assert "so tfdet is what made these runs identical" in output


def test_a_script_reports_json_keeps_its_fields_and_their_order():
    # The `--json` report is a contract: the typed records write the fields
    # the dicts they replaced wrote, in that order, and leave out the same.
    divergence = ScriptDivergence(
        training="fit #1 (model sequential)",
        found={"step": 3, "quantity": "data"},
        description="fit #1 (model sequential): bits diverged at step 3",
        runs=(0, 1),
    )
    assert list(divergence.to_dict()) == [
        "training", "step", "quantity", "description", "runs",
    ]  # fmt: skip
    assert divergence.to_dict()["runs"] == [0, 1]
    attribution = Attribution(
        alone={"rerun": "same bits", "threads": "differs"},
        responsible=("threads",),
        verdict="separated by threads",
    )
    attributed = dataclasses.replace(divergence, attribution=attribution)
    assert list(attributed.to_dict())[-1] == "attribution"
    # A script's attribution says no more than the dict it replaced.
    assert attributed.to_dict()["attribution"] == {
        "alone": {"rerun": "same bits", "threads": "differs"},
        "responsible": ["threads"],
        "verdict": "separated by threads",
    }

    facts = ProcessFacts(
        index=1, worker=None, name="run 1", perturbations={"hashseed": "seed 1"},
        ok=True, reason=None, returncode=0, timed_out=False, seconds=1.5,
    )  # fmt: skip
    said = {
        "index": 1, "worker": None, "name": "run 1",
        "perturbations": {"hashseed": "seed 1"}, "ok": True, "reason": None,
        "returncode": 0, "timed_out": False, "seconds": 1.5,
    }  # fmt: skip
    trained = ScriptTraining(
        end="completed", entry_points=("fit",), keras=("Keras 3",),
        steps_recorded=2, trainings=({"name": "fit #1", "steps": 2},),
        xla={"on": False, "notice": None}, own_copies={},
    )  # fmt: skip
    assert list(ScriptRunReport(facts, trained=trained).to_dict().items()) == list(
        {
            **said,
            "end": "completed",
            "entry_points": ["fit"],
            "keras": ["Keras 3"],
            "steps_recorded": 2,
            "trainings": [{"name": "fit #1", "steps": 2}],
            "xla": {"on": False, "notice": None},
            "own_copies": {},
            "spawned": 0,
        }.items()
    )
    failed = ScriptRunReport(
        dataclasses.replace(facts, ok=False, reason="exit 1", returncode=1),
        stderr_tail="Traceback",
    )
    assert list(failed.to_dict()) == [*said, "stderr_tail"]


def test_a_backup_dir_after_a_chdir_elsewhere_is_still_the_runs_own(
    tmp_path, monkeypatch
):
    # A script that calls os.chdir(...) and then BackupAndRestore("bk"): the
    # path is resolved as the script meant (in the directory it moved to),
    # and compared with the run's own directory, not with the new working
    # directory. Before: "bk" after the chdir counted as inside the run's
    # directory, so every run shared the real elsewhere/bk.
    from tfdet._child import _own_copies

    run_dir, elsewhere = tmp_path / "run0" / "project", tmp_path / "elsewhere"
    run_dir.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    monkeypatch.setattr(_own_copies, "own_copies", {})
    monkeypatch.setattr(_own_copies, "run_directory", str(run_dir), raising=False)
    os.chdir(elsewhere)  # The script's own chdir (monkeypatch restores it).
    copy = _own_copies.own_copy("bk")
    assert copy == os.path.join(
        run_dir, _own_copies.PRIVATE_DIR, str(elsewhere / "bk").lstrip(os.sep)
    )
    assert _own_copies.own_copies == {"bk": copy}
    # A path inside the run's directory is its own already.
    assert _own_copies.own_copy(run_dir / "bk") == run_dir / "bk"


@pytest.mark.parametrize(
    "words, expected",
    [
        (["--", "--lr", "0.1"], ["--lr", "0.1"]),
        # A `--` among the script's own arguments is the script's, as under
        # `python train.py a -- b` and `tfdet run`. Before: dropped.
        (["--", "a", "--", "b"], ["a", "--", "b"]),
        (["--", "--", "x"], ["--", "x"]),
        (["--runs", "3", "--", "data", "--", "--", "c"], ["data", "--", "--", "c"]),
    ],
)
def test_the_scripts_arguments_are_every_word_after_the_first_dashes(words, expected):
    from tfdet._cli import _training_flags, parse_flags

    args = parse_flags(["tfdet", "check", "--script", "train.py", *words])
    assert _training_flags.script_arguments(args, "check") == expected


# Reached through a symbolic link, imports a module beside its real file,
# moves elsewhere before naming its backup relatively, and ends with
# os._exit(0) after training.
_LINKED_SCRIPT = """
import os
import sys

import helper
import keras
import numpy as np

os.chdir(sys.argv[1])
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(helper.UNITS)])
model.compile("sgd", "mse")
model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, epochs=2, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore("bk")])
os._exit(0)
"""


@pytest.mark.slow
def test_a_linked_script_that_moves_and_ends_with_os_exit_is_checked(tmp_path):
    # Before: ModuleNotFoundError (sys.path[0] was the link's directory, not
    # the real file's); then both runs shared elsewhere/bk (the own-copy
    # logic compared the path with the cwd after the chdir); then every run
    # "exited 0 without writing its result". Each made the check exit 3.
    real, project, elsewhere = (tmp_path / name for name in ("real", "project", "else"))
    for directory in (real, project, elsewhere):
        directory.mkdir()
    (real / "train.py").write_text(_LINKED_SCRIPT)
    (real / "helper.py").write_text("UNITS = 1\n")
    (project / "train.py").symlink_to(real / "train.py")
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", "--script", "train.py", "--perturb", "none",
        "--json", str(report_path), "--", str(elsewhere),
        cwd=project,
    )  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert [run["end"] for run in report["run_reports"]] == ["called os._exit(0)"] * 2
    assert all(run["steps_recorded"] == 4 for run in report["run_reports"])
    assert any(notice.startswith("bk: ") for notice in report["notices"])
    assert not (elsewhere / "bk").exists()


def test_a_resumed_fit_numbers_its_steps_on_from_the_epoch_it_resumes_at():
    # tf_keras and Keras 3 both start a resumed fit at the backup's epoch:
    # its first step is that epoch's, numbered as the uninterrupted run did.
    from tfdet._child._script_hooks import resumed_epoch_start

    assert resumed_epoch_start(1, 8, []) == 8
    assert resumed_epoch_start(0, 8, []) == 0
    # Epoch length unknown: from the killed process's trace.
    kept = [{"step": s, "epoch": s // 3, "batch": s % 3} for s in range(5)]
    assert resumed_epoch_start(1, None, kept) == 3  # Recorded in that epoch.
    assert resumed_epoch_start(1, None, kept[:3]) == 3  # The epoch before ended.
    assert resumed_epoch_start(1, None, []) == 0


_OWN_SETTINGS = """\
import os
import sys

if "tensorflow" in sys.modules or "keras" in sys.modules:
    sys.exit("tensorflow was imported before the script's own settings")
{settings}
import numpy as np

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=4, epochs=1, verbose=0)
"""
_SETTINGS = {
    # Its own enable() pins oneDNN: it must come before `import tensorflow`.
    "own-enable": "import tfdet\n\ntfdet.enable(seed=1)\nimport keras",
    # tf_keras imported first imports TensorFlow inside it.
    "tf_keras-first": 'os.environ["TF_USE_LEGACY_KERAS"] = "1"\n'
    "import tf_keras as keras\n\nkeras.utils.set_random_seed(1)",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        "own-enable",
        pytest.param(
            "tf_keras-first",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("tf_keras") is None,
                reason="tf_keras is not installed",
            ),
        ),
    ],
)
def test_a_script_checked_without_tfdet_imports_tensorflow_itself(tmp_path, settings):
    # `--no-enable` leaves the script's settings first. The run's hooks
    # imported Keras before the script did, so a script that enables tfdet
    # itself was "too late to pin onednn" on a CPU where TensorFlow turns
    # oneDNN off by itself (an AMD EPYC Zen 3): every run failed. The hooks
    # wait for the script's own import: for a Keras that imports TensorFlow
    # inside it (tf_keras), until that Keras is whole.
    script = tmp_path / "own_settings.py"
    script.write_text(_OWN_SETTINGS.format(settings=_SETTINGS[settings]))
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", "--script", str(script), "--no-enable", "--perturb", "none",
        "--json", str(report_path),
    )  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert [run["steps_recorded"] for run in report["run_reports"]] == [2, 2]


@pytest.mark.slow
def test_processes_a_run_spawns_get_its_profile_and_are_said_not_recorded(
    tmp_path, tmp_path_factory
):
    # Before: a "spawn" or "forkserver" child of a check's run was a fresh
    # interpreter without enable(): its unseeded draw followed the clock
    # (or raised under TF_DETERMINISTIC_OPS). The control, without tfdet,
    # shows that the draws differ between runs when nothing seeds them.
    def children(*flags):
        out = tmp_path_factory.mktemp("children")
        code, report, output = _check_script(
            "spawned_search.py", "--perturb", "none", *flags, "--", str(out),
            tmp_path=tmp_path,
        )  # fmt: skip
        seen = [json.loads(p.read_text()) for p in sorted(out.iterdir())]
        return code, report, output, seen

    code, report, output, seen = children()
    assert code == EXIT_OK, output
    assert len(seen) == 2  # One file per run.
    assert [c["method"] for c in seen[0]] == ["spawn", "forkserver"]
    assert {c["seed"] for run in seen for c in run} == {report["seed"]}
    assert seen[0] == seen[1]  # The same draws in both runs' children.
    assert [r["spawned"] for r in report["run_reports"]] == [2, 2]
    assert "started 2 processes with multiprocessing" in output
    assert "each enabled with the run's settings" in output

    code, _, output, seen = children("--no-enable", "--no-attribute")
    assert code == EXIT_DIVERGED, output  # Its parent's fit is seeded by no one...
    assert {c["seed"] for run in seen for c in run} == {None}
    assert seen[0] != seen[1]  # ...and its children draw what they like.
    assert "without tfdet, as the run" in output
