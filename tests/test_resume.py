"""Exact resume: a training killed and resumed gives the bits of one that never stopped.

Each scenario kills a fresh process (SIGKILL, as a preemption does) and
resumes it in another, through Keras's own `BackupAndRestore` (which
`enable()` makes exact) or a `tf.train.Checkpoint` of a custom loop with
`tfdet.random_state`. The controls: the same interruption without tfdet's
patch (or without the random state) resumes into other bits.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal

import pytest
from packaging.version import Version

from tests.conftest import REPO, TENSORFLOW_PRODUCTS, clean_env, run_python

SCRIPTS = REPO / "tests" / "targets" / "scripts"
# From Keras 3.6 fit(shuffle=True) draws a PyDataset's batch order with
# random.shuffle; Keras 3.5 shuffled it in tf.data (seeded), where a resume
# without the epoch's start state is exact too: no control there.
KERAS_SHUFFLES_PYDATASET_WITH_RANDOM = Version(
    importlib.metadata.version("keras")
) >= Version("3.6")
TF_KERAS_INSTALLED = importlib.util.find_spec("tf_keras") is not None
FIT = SCRIPTS / "resumable_fit.py"
LOOP = SCRIPTS / "resumable_loop.py"


def _run(script, out, *args, killed: bool = False) -> str:
    """Runs `script OUT ARGS` in a fresh process; its stderr."""
    code = f"import runpy, sys; sys.argv = {[str(script), str(out), *args]!r}\n"
    code += f"runpy.run_path({str(script)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="0"))
    expected = -signal.SIGKILL if killed else 0
    assert result.returncode == expected, result.stderr[-3000:]
    return result.stderr


def _digest(path) -> str:
    return json.loads(path.read_text())["digest"]


def _interrupted_and_resumed(tmp_path, script, *args, interrupt) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    backup, out = tmp_path / "backup", tmp_path / "resumed.json"
    _run(script, out, str(backup), *args, *interrupt, killed=True)
    assert not out.exists()  # Killed before it finished.
    _run(script, out, str(backup), *args)
    return _digest(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, str]:
    """Final digests of the fit that never stopped, per input kind."""
    digests = {}
    for data in ("array", "tfdata"):
        directory = tmp_path_factory.mktemp(f"full-{data}")
        out = directory / "full.json"
        _run(FIT, out, str(directory / "backup"), "--data", data)
        digests[data] = _digest(out)
    return digests


@pytest.mark.slow
@pytest.mark.parametrize(
    ("save_freq", "interrupt"),
    [
        ("epoch", ("--kill", "2:0")),  # After epoch 2's first batch.
        ("3", ("--kill", "1:5")),  # Mid-epoch, 3 batches after the last save.
        ("3", ("--kill-at-save", "3")),  # While writing a backup.
    ],
    ids=["per-epoch", "mid-epoch", "killed-while-saving"],
)
def test_backup_and_restore_resumes_exactly(
    tmp_path, uninterrupted, save_freq, interrupt
):
    resumed = _interrupted_and_resumed(
        tmp_path, FIT, "--save-freq", save_freq, interrupt=interrupt
    )
    assert resumed == uninterrupted["array"]


@pytest.mark.slow
def test_a_reshuffling_tf_data_input_resumes_in_its_order(tmp_path, uninterrupted):
    resumed = _interrupted_and_resumed(
        tmp_path,
        FIT,
        "--data",
        "tfdata",
        "--save-freq",
        "3",
        interrupt=("--kill", "2:3"),
    )
    assert resumed == uninterrupted["tfdata"]


@pytest.mark.slow
def test_control_keras_own_backup_and_restore_resumes_into_other_bits(
    tmp_path, uninterrupted
):
    resumed = _interrupted_and_resumed(
        tmp_path, FIT, "--save-freq", "3", "--unpatched", interrupt=("--kill", "1:5")
    )
    assert resumed != uninterrupted["array"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "keras_args", [(), ("--tf-keras",)], ids=["keras3", "tf_keras"]
)
def test_a_custom_loop_resumes_exactly_with_tfdets_random_state(tmp_path, keras_args):
    if keras_args:
        pytest.importorskip("tf_keras")
    full = tmp_path / "full.json"
    _run(LOOP, full, str(tmp_path / "full-checkpoints"), *keras_args)
    kill = ("--kill", "10")
    exact = _interrupted_and_resumed(tmp_path / "a", LOOP, *keras_args, interrupt=kill)
    # The control: the checkpoint without the random state replays masks.
    replayed = _interrupted_and_resumed(
        tmp_path / "b", LOOP, "--without-random-state", *keras_args, interrupt=kill
    )
    assert exact == _digest(full) != replayed


def _checks_at_once(commands: dict[str, list[str]], cwd=None) -> dict[str, dict]:
    """Runs several `tfdet check --json` commands side by side; their reports.

    A command's arguments after `--` are its script's: `--json` goes before.
    """
    import subprocess
    import sys
    import tempfile

    def with_json(args: list[str], path: str) -> list[str]:
        split = args.index("--") if "--" in args else len(args)
        return [*args[:split], "--json", path, *args[split:]]

    with tempfile.TemporaryDirectory() as reports:
        processes = {
            name: subprocess.Popen(
                [sys.executable, "-m", "tfdet", *with_json(args, f"{reports}/{name}")],
                env=clean_env(),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name, args in commands.items()
        }
        outputs = {
            name: p.communicate(timeout=1800)[0] for name, p in processes.items()
        }
        found = {}
        for name, process in processes.items():
            assert process.returncode in (0, 1), outputs[name]
            with open(f"{reports}/{name}", encoding="utf-8") as handle:
                found[name] = json.load(handle)
        return found


@pytest.mark.slow
def test_check_interrupts_a_target_run_and_resumes_it_exactly_with_tfdet():
    # tfdet's own checkpoint of a TARGET carries the layers' seed states; the
    # control (without tfdet: model and optimizer only) replays Dropout masks.
    common = ["check", "builtin:cnn", "--steps", "4", "--device", "cpu",
              "--perturb", "interrupt", "--no-attribute"]  # fmt: skip
    reports = _checks_at_once({"tfdet": common, "plain": [*common, "--no-enable"]})
    assert reports["tfdet"]["verdict"] == "identical"
    resumed = reports["tfdet"]["devices"]["cpu"]["runs"][1]
    assert "killed (SIGKILL) after 2" in resumed["perturbations"]["interrupt"]
    assert resumed["steps_recorded"] == 4
    divergence = reports["plain"]["devices"]["cpu"]["divergence"]
    assert reports["plain"]["verdict"] == "diverged"
    assert divergence["step"] == 2  # The first step after the resume.


@pytest.mark.slow
def test_check_migrate_resumes_on_another_pool_size_with_the_same_bits():
    # Killed on a pool of 1 thread, resumed on a pool of 3. Under the
    # default the bits do not follow the pool: identical. The control, with
    # TensorFlow's own products, diverges exactly at the first step after the
    # move (2 of 4), so the first half did run on the first pool.
    common = ["check", "builtin:bn_gelu", "--steps", "4", "--device", "cpu",
              "--perturb", "migrate,threads", "--no-attribute",
              "--threads", "1"]  # fmt: skip
    reports = _checks_at_once(
        {
            "free": common,
            "control": [*common, "--patches", TENSORFLOW_PRODUCTS],
        }
    )
    assert reports["free"]["verdict"] == "identical"
    baseline, moved = reports["free"]["devices"]["cpu"]["runs"]
    assert "on this machine, and resumed" in moved["perturbations"]["migrate"]
    assert moved["steps_recorded"] == 4
    # The process that resumed (and wrote the result) had the other pool.
    assert baseline["profile"]["intra_op_threads"] == 1
    assert moved["profile"]["intra_op_threads"] == 3
    assert reports["control"]["verdict"] == "diverged"
    assert reports["control"]["devices"]["cpu"]["divergence"]["step"] == 2


@pytest.mark.slow
def test_check_script_interrupts_and_the_scripts_own_backup_resumes_it(tmp_path):
    (tmp_path / "preemptible_fit.py").write_text(
        (SCRIPTS / "preemptible_fit.py").read_text()
    )
    # The verdicts and the step are asserted, not the cause: no attribution.
    common = ["check", "--script", "preemptible_fit.py", "--perturb", "interrupt",
              "--no-attribute"]  # fmt: skip
    reports = _checks_at_once(
        {"tfdet": common, "plain": [*common, "--no-enable"]}, cwd=tmp_path
    )
    assert reports["tfdet"]["verdict"] == "identical"
    assert reports["plain"]["verdict"] == "diverged"
    # Keras's own BackupAndRestore retrains the resumed epoch from its start.
    assert reports["plain"]["divergence"]["step"] == 0


@pytest.mark.slow
def test_check_script_interrupts_a_gan_and_records_every_step_it_trains(tmp_path):
    # keras.io's DCGAN form: two optimizers of a custom compile, and an unused
    # default `model.optimizer`. The resumed process used to take every batch
    # for a skipped one (that optimizer never moves): a false "diverged".
    (tmp_path / "resumable_gan.py").write_text(
        (SCRIPTS / "resumable_gan.py").read_text()
    )
    common = ["check", "--script", "resumable_gan.py", "--perturb", "interrupt",
              "--no-attribute"]  # fmt: skip
    script_args = ["--", "out.json", "backup", "--save-freq", "1"]
    reports = _checks_at_once(
        {
            "tfdet": [*common, "--seed", "5", *script_args],
            # Keras's own BackupAndRestore (the script leaves tfdet's patch
            # out): its resume is inexact, and the check must say so.
            "keras": [*common, "--no-enable", *script_args, "--unpatched"],
        },
        cwd=tmp_path,
    )
    assert reports["tfdet"]["verdict"] == "identical", reports["tfdet"]
    assert reports["keras"]["verdict"] == "diverged"
    assert reports["keras"]["divergence"]["quantity"] != "steps"


def test_the_resume_state_round_trips_through_json_bit_for_bit():
    import random

    import numpy as np

    from tfdet._resume import _keras3 as backup

    rng = np.random.default_rng(0)
    state = {
        "epoch": 2,
        "steps_done": 5,
        "iterations": 21,
        "seeds": [("dropout#0", np.array([7, 2**62 + 1], np.int64))],
        "global_seed": np.array([3, 4], np.uint32),
        "metrics": [
            np.array(np.pi, np.float32),
            np.array([np.nan, -0.0, 1e-45, np.inf], np.float32),
            rng.standard_normal((3, 2)),
        ],
        "python_random": random.Random(5).getstate(),
        "numpy_random": np.random.RandomState(9).get_state(),
        "eager_seed": random.Random(6).getstate(),
        "counters": (3, 4),
        "epoch_random": (
            random.Random(7).getstate(),
            np.random.RandomState(8).get_state(),
        ),
        "fit": {"steps_per_epoch": 8, "batch_size": 32, "samples": 256},
    }
    path = "backup/tfdet-0.state.json"
    text = json.dumps(backup._encode_state(state))
    decoded = backup._decode_state(json.loads(text), path)
    # A backup written before the epoch's start state was kept still reads.
    older = {k: v for k, v in json.loads(text).items() if k != "epoch_random"}
    assert backup._decode_state(older, path)["epoch_random"] is None
    # ... and one written before the fit's geometry was kept.
    older = {k: v for k, v in json.loads(text).items() if k != "fit"}
    assert backup._decode_state(older, path)["fit"] is None

    def bits(value):
        if isinstance(value, np.ndarray):
            return (value.dtype.str, value.shape, value.tobytes())
        if isinstance(value, list | tuple):
            return tuple(bits(item) for item in value)
        return value

    assert {k: bits(v) for k, v in decoded.items()} == {
        k: bits(v) for k, v in state.items()
    }
    random.setstate(decoded["python_random"])  # Accepted as they are.
    np.random.set_state(decoded["numpy_random"])


def test_a_backup_position_is_validated_against_the_resumed_fits_epochs():
    # Killed at epoch 1 after 7 of 8 batches of 8 (64 samples), resumed with
    # batches of 16 or on a data set that shrank: resumed at "7 steps into
    # epoch 1", fit skipped batches across the epoch boundary and said
    # nothing. Each difference is named, the backup's value and the fit's.
    import numpy as np

    from tfdet import ResumeError
    from tfdet._resume import _state

    x64, x60 = np.zeros((64, 3)), np.zeros((60, 3))
    saved = _state.fit_geometry(x64, 8, 8)
    assert saved == {"steps_per_epoch": 8, "batch_size": 8, "samples": 64}
    where = "epoch 1, 7 steps into it"
    _state.check_same_geometry("bk", where, saved, _state.fit_geometry(x64, 8, 8))
    # The positional form fit(x, y, batch_size) and Keras's default of 32.
    assert _state.fit_arguments((x64, None, 16), {}) == (x64, 16)
    assert _state.fit_geometry([x64, x64], None, 2)["batch_size"] == 32
    with pytest.raises(ResumeError) as caught:
        _state.check_same_geometry("bk", where, saved, _state.fit_geometry(x64, 16, 4))
    message = str(caught.value)
    assert "steps per epoch 8 in the backup, 4 now" in message
    assert "batch size 8 in the backup, 16 now" in message
    assert "bk" in message and where in message and "delete the backup" in message
    # A data set that shrank within the last batch keeps the epoch length.
    with pytest.raises(ResumeError, match="samples 64 in the backup, 60 now"):
        _state.check_same_geometry("bk", where, saved, _state.fit_geometry(x60, 8, 8))
    # A tf.data input: its size and batch are its own, the epoch length known.
    data = _state.fit_geometry(object(), None, 8)
    assert data == {"steps_per_epoch": 8, "batch_size": None, "samples": None}
    with pytest.raises(ResumeError, match="steps per epoch 8 in the backup, 6 now"):
        _state.check_same_geometry(
            "bk", where, data, _state.fit_geometry(object(), 5, 6)
        )
    # A backup without the geometry (an older tfdet's): its position must
    # still lie in the resumed epochs.
    _state.check_same_geometry("bk", where, None, data)
    _state.check_position_in_epoch("bk", 8, 8)  # The epoch's last batch.
    _state.check_position_in_epoch("bk", 7, None)  # Epoch length unknown.
    with pytest.raises(ResumeError, match="7 steps of the epoch trained in the"):
        _state.check_position_in_epoch("bk", 7, 4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "keras_args", [(), ("--tf-keras",)], ids=["keras3", "tf_keras"]
)
def test_a_resume_with_another_batch_size_is_refused_naming_both(tmp_path, keras_args):
    # Killed at epoch 1 after batch 6 (8 batches of 32 an epoch, a backup
    # each batch), resumed with batches of 64: the resume skipped 7 batches
    # across the epoch boundary (Keras 3: 4 of epoch 1, 3 of epoch 2) and
    # said nothing. It now stops before training, naming both values, and
    # the backup stays for a resume with the first settings.
    if keras_args:
        pytest.importorskip("tf_keras")
    backup, out = tmp_path / "backup", tmp_path / "out.json"
    args = [str(backup), "--save-freq", "1", *keras_args]
    _run(FIT, out, *args, "--kill", "1:6", killed=True)
    argv = [str(FIT), str(out), *args, "--batch-size", "64"]
    code = f"import runpy, sys; sys.argv = {argv!r}\n"
    code += f"runpy.run_path({str(FIT)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="0"))
    assert result.returncode != 0 and not out.exists(), result.stderr[-2000:]
    assert "tfdet._errors.ResumeError" in result.stderr, result.stderr[-2000:]
    assert "steps per epoch 8 in the backup, 4 now" in result.stderr
    assert "batch size 32 in the backup, 64 now" in result.stderr
    assert any(backup.iterdir())  # Not deleted.


def test_a_damaged_keras_backup_is_an_error_naming_the_file(tmp_path):
    # A pointer that names no generation was read as "no backup": the fit
    # trained from step 0 and Keras deleted the directory at its end. A
    # truncated weights file gave h5py's raw OSError.
    import h5py

    from tfdet import ResumeError
    from tfdet._resume import _keras3 as backup

    pointer = tmp_path / backup.CURRENT
    assert backup._current(str(tmp_path)) is None  # No backup yet.
    # Killed while it wrote its first backup: nothing was made current.
    (tmp_path / "tfdet-0.state.json").write_text("{}")
    assert backup._current(str(tmp_path)) is None
    (tmp_path / "tfdet-0.weights.h5").write_bytes(b"")
    pointer.write_text("0")
    assert backup._current(str(tmp_path)) == 0
    for damaged in ("", "§?", "-1", "0\n1"):
        pointer.write_text(damaged)
        with pytest.raises(ResumeError, match="tfdet_current") as caught:
            backup._current(str(tmp_path))
        assert "not the number of a backup generation" in str(caught.value)
    pointer.write_text("0")
    (tmp_path / "tfdet-0.weights.h5").unlink()
    with pytest.raises(ResumeError, match=r"tfdet-0\.weights\.h5 .*missing"):
        backup._current(str(tmp_path))
    weights = tmp_path / "w.weights.h5"
    with h5py.File(weights, "w") as handle:
        handle["layer"] = list(range(1000))
    backup._check_weights_file(str(weights))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ResumeError, match="w.weights.h5 .*truncated file"):
        backup._check_weights_file(str(weights))


@pytest.mark.slow
@pytest.mark.parametrize("keras_name", ["keras3", "tf_keras"])
def test_a_resume_from_a_damaged_backup_stops_and_keeps_the_backup(
    tmp_path, keras_name
):
    # The damaged pointer was ignored (trained from step 0, the directory
    # deleted at the end; tf_keras: when TensorFlow could not parse it); a
    # missing or truncated weights file raised h5py's or TensorFlow's own
    # error. Each stops the fit with tfdet's, naming the file.
    if keras_name == "tf_keras":
        pytest.importorskip("tf_keras")
    script = SCRIPTS / "damaged_backup.py"
    argv = [str(script), keras_name, str(tmp_path / "backup")]
    code = f"import runpy, sys; sys.argv = {argv!r}\n"
    code += f"runpy.run_path({str(script)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    pointer, weights = (
        ("tfdet/checkpoint", "tfdet/ckpt-")
        if keras_name == "tf_keras"
        else ("tfdet_current", "tfdet-1.weights.h5")
    )
    assert set(found) == {
        "garbled pointer", "empty pointer", "missing weights", "truncated weights"
    }  # fmt: skip
    for case, (error, message, kept) in found.items():
        assert (error, kept) == ("ResumeError", True), (case, message)
        assert (pointer if "pointer" in case else weights) in message, message
        assert "restore the file, or delete the backup directory" in message


@pytest.mark.slow
def test_a_planted_pickle_in_the_backup_directory_is_never_run(tmp_path):
    # Whoever can write the backup directory (Keras's example is /tmp/backup)
    # must not run code in the training process at its resume.
    import pickle

    backup, out, marker = tmp_path / "backup", tmp_path / "out.json", tmp_path / "ran"
    _run(FIT, out, str(backup), "--save-freq", "3", "--kill", "1:5", killed=True)
    (state,) = backup.glob("tfdet-*.state.json")

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    state.write_bytes(pickle.dumps(Planted()))
    code = f"import runpy, sys; sys.argv = {[str(FIT), str(out), str(backup)]!r}\n"
    code += f"runpy.run_path({str(FIT)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="0"))
    assert result.returncode != 0 and not marker.exists()
    assert "to hold a tfdet resume state" in result.stderr
    assert "Delete the backup directory" in result.stderr


GAN = SCRIPTS / "resumable_gan.py"


@pytest.mark.slow
def test_a_tf_keras_gan_with_two_optimizers_resumes_exactly(tmp_path):
    # keras.io's DCGAN form: the optimizers of a custom compile are built in
    # the first step, after Keras's resume loaded (skipped) them. (Keras 3's:
    # test_check_script_interrupts_a_gan_and_records_every_step_it_trains.)
    pytest.importorskip("tf_keras")
    keras_args = ("--tf-keras",)
    full = tmp_path / "full.json"
    _run(GAN, full, str(tmp_path / "full-backup"), *keras_args)
    steps = json.loads(full.read_text())["steps"]
    kill = ("--kill", "1:3")
    resumed = _interrupted_and_resumed(tmp_path / "a", GAN, *keras_args, interrupt=kill)
    control = _interrupted_and_resumed(
        tmp_path / "b", GAN, "--unpatched", *keras_args, interrupt=kill
    )
    assert resumed == _digest(full) != control
    assert json.loads((tmp_path / "a" / "resumed.json").read_text())["steps"] == steps


@pytest.mark.slow
def test_a_fit_killed_on_one_thread_resumes_on_two_with_the_same_bits(tmp_path):
    # A preempted job restarted on a machine with another core count, with
    # Keras's own BackupAndRestore: under the default the bits do not follow
    # the pool size, so the resume on 2 threads gives the bits of the run
    # that trained on 1 throughout. The control, with TensorFlow's own
    # products: the resumed steps follow the pool and the bits differ.
    conv = ("--model", "conv", "--save-freq", "3")

    def moved(*patch) -> tuple[str, str]:
        folder = tmp_path / ("control" if patch else "default")
        folder.mkdir()
        backup, full, resumed = (
            folder / "backup",
            folder / "full.json",
            folder / "r.json",
        )
        _run(FIT, full, str(folder / "full-backup"), *conv, *patch, "--threads", "1")
        _run(FIT, resumed, str(backup), *conv, *patch, "--threads", "1",
             "--kill", "1:5", killed=True)  # fmt: skip
        _run(FIT, resumed, str(backup), *conv, *patch, "--threads", "2")
        return _digest(full), _digest(resumed)

    full, resumed = moved()
    assert resumed == full
    full, resumed = moved("--tensorflow-products")
    assert resumed != full


@pytest.fixture(scope="module")
def uninterrupted_tf_keras(tmp_path_factory) -> dict[str, str]:
    """Final digests of the tf_keras fit that never stopped, per input kind."""
    pytest.importorskip("tf_keras")
    digests = {}
    for data in ("array", "tfdata", "tfdata-repeat", "generator"):
        directory = tmp_path_factory.mktemp(f"tf-keras-{data}")
        out = directory / "full.json"
        stderr = _run(FIT, out, str(directory / "backup"), "--tf-keras", "--data", data)
        assert "tfdet:" not in stderr  # Nothing said inexact about these fits.
        digests[data] = _digest(out)
    return digests


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "args", "interrupt"),
    [
        ("array", ("--save-freq", "epoch"), ("--kill", "2:0")),
        ("array", ("--save-freq", "3"), ("--kill", "1:5")),
        ("array", ("--save-freq", "3"), ("--kill-at-save", "3")),
        ("array", ("--save-freq", "3", "--backups", "2"), ("--kill", "1:5")),
        ("tfdata", ("--save-freq", "3"), ("--kill", "2:3")),
        ("tfdata-repeat", ("--save-freq", "3"), ("--kill", "2:3")),
        ("generator", ("--save-freq", "3"), ("--kill", "2:3")),
    ],
    ids=[
        "per-epoch",
        "mid-epoch",
        "killed-while-saving",
        "two-callbacks",
        "reshuffling-tf-data",
        "one-stream-for-every-epoch",
        "generator",
    ],
)
def test_tf_keras_backup_and_restore_resumes_exactly(
    tmp_path, uninterrupted_tf_keras, data, args, interrupt
):
    resumed = _interrupted_and_resumed(
        tmp_path, FIT, "--tf-keras", "--data", data, *args, interrupt=interrupt
    )
    assert resumed == uninterrupted_tf_keras[data]
    assert json.loads((tmp_path / "resumed.json").read_text())["steps"] == 32


@pytest.mark.slow
def test_control_tf_keras_own_backup_and_restore_resumes_into_other_bits(tmp_path):
    # tf_keras's own callback: Dropout's kernel-held state, the epoch's first
    # batches trained again.
    pytest.importorskip("tf_keras")
    args = ("--tf-keras", "--unpatched", "--data", "array", "--save-freq", "3")
    full = tmp_path / "full.json"
    _run(FIT, full, str(tmp_path / "full-backup"), *args)
    resumed = _interrupted_and_resumed(
        tmp_path, FIT, *args, interrupt=("--kill", "2:3")
    )
    assert resumed != _digest(full)


INEXACT = SCRIPTS / "inexact_resume.py"


@pytest.mark.parametrize("keras_name", ["keras3", "tf_keras"])
def test_a_step_drawing_from_kernel_held_random_state_says_its_resume_is_not_exact(
    tmp_path, keras_name
):
    if keras_name == "tf_keras":
        pytest.importorskip("tf_keras")
    stderr = _run(INEXACT, keras_name, "kernel-random", str(tmp_path / "backup"))
    assert "keep their state in their kernel (RandomStandardNormal" in stderr


@pytest.mark.slow
def test_a_tf_keras_sequence_input_says_its_resume_is_not_exact(tmp_path):
    pytest.importorskip("tf_keras")
    backup = str(tmp_path / "backup")
    _run(INEXACT, "tf_keras", "sequence", backup, "--kill", killed=True)
    stderr = _run(INEXACT, "tf_keras", "sequence", backup)
    assert (
        "a keras.utils.Sequence input (its order is drawn as it runs) is not" in stderr
    )


@pytest.mark.slow
def test_two_backup_callbacks_resume_exactly_and_train_every_step(
    tmp_path, uninterrupted
):
    two = ("--backups", "2", "--save-freq", "3")
    resumed = _interrupted_and_resumed(tmp_path, FIT, *two, interrupt=("--kill", "1:5"))
    assert resumed == uninterrupted["array"]
    assert json.loads((tmp_path / "resumed.json").read_text())["steps"] == 32


def test_two_backup_callbacks_at_other_positions_are_refused_with_what_to_do(
    tmp_path,
):
    backup, out = tmp_path / "backup", tmp_path / "out.json"
    two = ("--backups", "2", "--save-freq", "3,epoch")
    _run(FIT, out, str(backup), *two, "--kill", "1:5", killed=True)
    code = (
        f"import runpy, sys; sys.argv = {[str(FIT), str(out), str(backup), *two]!r}\n"
    )
    code += f"runpy.run_path({str(FIT)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="0"))
    assert result.returncode != 0 and not out.exists()
    assert "Keep one BackupAndRestore, or give them the same save_freq" in result.stderr


@pytest.mark.slow
def test_check_script_interrupt_waits_for_a_per_epoch_backup_and_finds_an_inexact_resume(
    tmp_path,
):
    # Keras's default save frequency is one backup per epoch: killed after 2
    # steps, before any backup, the "resumed" run restarted from scratch and
    # the check said identical. The kill now waits for the first backup, and
    # a learning-rate counter outside it makes the resume inexact: diverged.
    (tmp_path / "lr.py").write_text(
        (SCRIPTS / "per_epoch_backup_lr_counter.py").read_text()
    )
    (tmp_path / "none.py").write_text((SCRIPTS / "no_backup_fit.py").read_text())
    common = ["check", "--perturb", "interrupt", "--no-attribute", "--script"]
    reports = _checks_at_once(
        {"lr": [*common, "lr.py"], "none": [*common, "none.py"]}, cwd=tmp_path
    )
    assert reports["lr"]["verdict"] == "diverged"
    interrupted = reports["lr"]["run_reports"][1]["perturbations"]["interrupt"]
    assert "follows a backup" in interrupted
    # A script that saves nothing is not said to be interrupted and resumed.
    assert reports["none"]["verdict"] == "identical"
    skipped = reports["none"]["perturbations_skipped"]["interrupt"]
    assert "wrote no backup" in skipped and "save_freq" in skipped
    run = reports["none"]["run_reports"][1]["perturbations"]["interrupt"]
    assert run.startswith("not applied: ")


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root"
)
@pytest.mark.parametrize("change", ["other-owner", "world-writable"])
def test_a_backup_directory_someone_else_controls_is_refused(tmp_path, change):
    backup, out = tmp_path / "backup", tmp_path / "out.json"
    _run(FIT, out, str(backup), "--save-freq", "3", "--kill", "1:5", killed=True)
    if change == "other-owner":
        os.chown(backup, 65534, 65534)  # nobody
    else:
        os.chmod(backup, 0o777)
    code = f"import runpy, sys; sys.argv = {[str(FIT), str(out), str(backup)]!r}\n"
    code += f"runpy.run_path({str(FIT)!r}, run_name='__main__')"
    result = run_python(code, env=clean_env(PYTHONHASHSEED="0"))
    assert result.returncode != 0 and not out.exists()
    assert "to be yours alone" in result.stderr
    assert ("owned by user id 65534" if change == "other-owner" else "every user") in (
        result.stderr
    )


@pytest.mark.slow
def test_a_pydataset_input_resumes_exactly_at_an_epoch_boundary(tmp_path):
    # Its own epoch hooks reshuffle its order: the resume replays them, as
    # fit ran them, so the resumed epochs read the batches in the same order.
    full = tmp_path / "full.json"
    _run(FIT, full, str(tmp_path / "full-backup"), "--data", "pydataset")
    args = ("--data", "pydataset")
    resumed = _interrupted_and_resumed(
        tmp_path / "a", FIT, *args, interrupt=("--kill", "2:0")
    )
    control = _interrupted_and_resumed(
        tmp_path / "b", FIT, *args, "--unpatched", interrupt=("--kill", "2:0")
    )
    assert resumed == _digest(full) != control


@pytest.mark.slow
def test_check_script_interrupt_compares_every_resumed_batch(tmp_path):
    # The NeMo form: each step's batch is in the trace, so a resume that
    # trains other batches is caught at the first one, as "data". A
    # reshuffling tf.data input and a PyDataset resumed mid-epoch train the
    # batches of the run that never stopped; the control (a backup without
    # the epoch's start state) trains another batch at the first resumed step.
    (tmp_path / "resumable_fit.py").write_text(FIT.read_text())
    common = ["check", "--script", "resumable_fit.py", "--perturb", "interrupt",
              "--seed", "3", "--no-attribute"]  # fmt: skip
    script = ["--", "out.json", "backup", "--save-freq", "1", "--data"]
    # (A generator's resume: test_one_stream_for_every_epoch_resumes_at_its_position;
    # tf_keras's, resumed by check and by hand with its controls:
    # test_check_script_numbers_a_tf_keras_fit_resumed_past_epoch_0_as_the_uninterrupted_run,
    # test_tf_keras_backup_and_restore_resumes_exactly.)
    checks = {
        "tfdata": [*common, *script, "tfdata"],
        "pydataset": [*common, *script, "pydataset"],
        "control": [*common, *script, "pydataset", "--drop-epoch-random"],
    }
    reports = _checks_at_once(checks, cwd=tmp_path)
    assert reports["tfdata"]["verdict"] == "identical"
    if not KERAS_SHUFFLES_PYDATASET_WITH_RANDOM:
        # Measured on TF 2.16 + Keras 3.5: exact in one matrix run, not in
        # another on a loaded machine (its tf.data shuffle of the batches).
        return
    # fit(shuffle=True) has Keras draw a PyDataset's batch order with
    # random.shuffle as each epoch's iterator starts: a mid-epoch resume
    # draws it again from the global generators as the epoch began.
    assert reports["pydataset"]["verdict"] == "identical"
    divergence = reports["control"]["divergence"]
    assert reports["control"]["verdict"] == "diverged"
    # Killed after its third step (the first past 2 that follows a backup):
    # the first resumed step trains another batch.
    assert (divergence["quantity"], divergence["step"]) == ("data", 3), divergence


@pytest.mark.slow
@pytest.mark.parametrize("data", ["generator", "tfdata-repeat"])
def test_one_stream_for_every_epoch_resumes_at_its_position(tmp_path, data):
    # fit(steps_per_epoch=8) draws every epoch from one iterator: a Python
    # generator, a repeated tf.data. A fresh process starts the stream at its
    # first batch; the resume pulls what the finished epochs took (before,
    # a generator resumed in epoch 2 retrained epoch 0's batches:
    # 77913aa56e570eef instead of 4a43dbd124f324ba). The control: Keras's own
    # BackupAndRestore.
    full = tmp_path / "full.json"
    _run(FIT, full, str(tmp_path / "full-backup"), "--data", data)
    args = ("--data", data, "--save-freq", "1")
    interrupt = ("--kill", "2:3")
    resumed = _interrupted_and_resumed(tmp_path / "a", FIT, *args, interrupt=interrupt)
    control = _interrupted_and_resumed(
        tmp_path / "b", FIT, *args, "--unpatched", interrupt=interrupt
    )
    assert resumed == _digest(full) != control


@pytest.mark.slow
@pytest.mark.parametrize("keras_args", [[], ["tf_keras"]], ids=["keras3", "tf_keras"])
def test_a_manual_resume_from_a_saved_model_says_it_is_not_exact(tmp_path, keras_args):
    # ModelCheckpoint + load_model + fit(initial_epoch=2): the saved model
    # holds no seed state, so the resumed epochs replay the first epochs'
    # Dropout masks: other bits, and tfdet says so (the run that never
    # stopped, which starts at epoch 0, is not warned).
    if keras_args:
        pytest.importorskip("tf_keras")
    script = SCRIPTS / "model_checkpoint_resume.py"

    def run(out, checkpoint, mode):
        argv = [str(script), str(out), str(checkpoint), mode, *keras_args]
        code = f"import runpy, sys; sys.argv = {argv!r}\n"
        code += f"runpy.run_path({str(script)!r}, run_name='__main__')"
        return run_python(code, env=clean_env(PYTHONHASHSEED="0"))

    full = run(tmp_path / "full.json", tmp_path / "a.keras", "full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run(tmp_path / "resumed.json", tmp_path / "b.keras", "kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run(tmp_path / "resumed.json", tmp_path / "b.keras", "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warning = "fit(initial_epoch=2) continues a model whose random layers"
    assert warning in resumed.stderr and "not exact" in resumed.stderr
    assert warning not in full.stderr
    assert _digest(tmp_path / "resumed.json") != _digest(tmp_path / "full.json")


@pytest.mark.slow
@pytest.mark.skipif(not TF_KERAS_INSTALLED, reason="tf_keras is not installed")
def test_check_script_numbers_a_tf_keras_fit_resumed_past_epoch_0_as_the_uninterrupted_run(
    tmp_path,
):
    # A per-epoch backup: the kill comes in epoch 1, and the resumed tf_keras
    # process starts at epoch 1. It numbered its steps from 0 again, so its
    # epoch 1 batch 0 was compared with the other run's epoch 0 batch 0: a
    # false "diverged at epoch 1, step 0, data". The control: a resume that
    # trains other batches on purpose is still found, at its first step (8).
    (tmp_path / "resumable_fit.py").write_text(FIT.read_text())
    common = ["check", "--script", "resumable_fit.py", "--perturb", "interrupt",
              "--seed", "3", "--no-attribute"]  # fmt: skip
    script = ["--", "out.json", "backup", "--tf-keras"]
    reports = _checks_at_once(
        {
            "exact": [*common, *script],
            "control": [*common, *script, "--other-data-on-resume"],
        },
        cwd=tmp_path,
    )
    assert reports["exact"]["verdict"] == "identical", reports["exact"]
    interrupted = reports["exact"]["run_reports"][1]["perturbations"]["interrupt"]
    assert not interrupted.startswith("not applied"), interrupted
    divergence = reports["control"]["divergence"]
    assert reports["control"]["verdict"] == "diverged"
    found = (divergence["quantity"], divergence["epoch"], divergence["step"])
    assert found == ("data", 1, 8), divergence
