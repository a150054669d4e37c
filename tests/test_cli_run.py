"""`tfdet run`: pins the environment, enables tfdet, runs the user's code.

Usage errors are decided before anything is started, so they are checked
through `tfdet._cli.main` in this process; the runs themselves are fresh
processes (`python -m tfdet run ...`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import clean_env, last_json_line, run_tfdet
from tfdet._cli import build_parser, main
from tfdet._cli.run import _split_command
from tfdet._errors import EXIT_USAGE
from tfdet._pin import _isa

# A user script that reports what it sees, calls tfdet.enable() itself with
# the settings `tfdet run` was given, and exits with a chosen status.
_SCRIPT = """
import json, os, sys
import tfdet

active = tfdet.profile()
mine = tfdet.enable(seed=3, threads=2)
again = tfdet.enable(seed=3, threads=2, strict=False)
try:
    tfdet.enable(seed=4, threads=2)
    mismatch = None
except tfdet.ProfileMismatchError as error:
    mismatch = {k: list(v) for k, v in error.differences.items()}
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "enabled_before_script": active is not None,
    "same_profile": mine is active and again is active,
    "mismatch": mismatch,
    "profile": mine.to_dict(),
    "hash_randomization": sys.flags.hash_randomization,
    "env": {name: os.environ.get(name) for name in (
        "PYTHONHASHSEED", "TF_NUM_INTRAOP_THREADS", "ONEDNN_MAX_CPU_ISA",
        "TF_DETERMINISTIC_OPS")},
}))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    # Named like an interpreter on purpose: `python_train.py` is a script.
    path = tmp_path / "scripts" / "python_train.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(_SCRIPT))
    return path


def test_script_runs_as_main_with_arguments_exit_status_and_settings(
    script: Path, tmp_path: Path
) -> None:
    result = run_tfdet(
        "run",
        "--seed",
        "3",
        "--threads",
        "2",
        str(script),
        "data.csv",
        "--epochs",
        "2",
        "-v",
        "--help",
        env=clean_env(EXIT_WITH="7"),
        cwd=tmp_path,
    )
    assert result.returncode == 7, result.stderr[-3000:]
    seen = last_json_line(result.stdout)
    assert seen["name"] == "__main__"
    # Flags after the script belong to the script, --help included.
    assert seen["argv"] == [str(script), "data.csv", "--epochs", "2", "-v", "--help"]
    assert seen["path0"] == str(script.parent)  # As `python script.py` would.
    # The script's own enable() with the same settings is the active profile.
    assert seen["enabled_before_script"] and seen["same_profile"]
    assert seen["mismatch"] == {"seed": [3, 4]}
    profile = seen["profile"]
    assert (
        profile["seed"],
        profile["intra_op_threads"],
        profile["inter_op_threads"],
    ) == (
        3,
        2,
        2,  # The default sums AddN in a fixed order: the inter-op pool too.
    )
    # PYTHONHASHSEED was set before the interpreter started: in force, no warning.
    assert profile["python_hash_seed"] == "3" and seen["hash_randomization"] == 1
    assert "PYTHONHASHSEED" not in result.stderr
    assert seen["env"]["PYTHONHASHSEED"] == "3"
    assert seen["env"]["TF_NUM_INTRAOP_THREADS"] == "2"
    assert seen["env"]["TF_DETERMINISTIC_OPS"] == "1"
    if _isa.applies():
        assert seen["env"]["ONEDNN_MAX_CPU_ISA"] == profile["cpu_isa"] == "AVX2"


def test_module_runs_with_its_own_flags(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "__main__.py").write_text(
        textwrap.dedent(
            """
            import json, sys
            import tfdet
            print(json.dumps({"name": __name__, "argv": sys.argv[1:],
                              "profile": tfdet.profile().to_dict()}))
            sys.exit(5)
            """
        )
    )
    result = run_tfdet(
        "run", "--seed", "9", "-m", "trainer", "--seed", "1", "--help", cwd=tmp_path
    )
    assert result.returncode == 5, result.stderr[-3000:]
    seen = last_json_line(result.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == ["--seed", "1", "--help"]
    assert seen["profile"]["seed"] == 9
    assert seen["profile"]["python_hash_seed"] == "9"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["run", "missing_script.py"], id="missing-script"),
        pytest.param(["run"], id="no-script"),
        pytest.param(["run", "--"], id="only-dashes"),
        pytest.param(["run", "-m"], id="m-without-module"),
        pytest.param(["run", "-m", "tfdet_no_such_module_xyz"], id="missing-module"),
        # A package that exists, a submodule that does not (found on disk,
        # without running the package's __init__).
        pytest.param(["run", "-m", "json.no_such_submodule"], id="missing-submodule"),
        pytest.param(["run", "-m", "json.tool.deeper"], id="module-not-a-package"),
        pytest.param(["run", "--bogus", "SCRIPT"], id="unknown-flag"),
        pytest.param(["run", "--seed", "-1", "SCRIPT"], id="negative-seed"),
        pytest.param(["run", "--seed", "4294967296", "SCRIPT"], id="seed-too-big"),
        pytest.param(["run", "--seed", "x", "SCRIPT"], id="seed-not-int"),
        pytest.param(["run", "--threads", "0", "SCRIPT"], id="zero-threads"),
        pytest.param(["run", "--cpu-isa", "AVX3", "SCRIPT"], id="unknown-isa"),
        pytest.param(["run", "--onednn", "--no-onednn", "SCRIPT"], id="onednn-both"),
        pytest.param([], id="no-command"),
        pytest.param(["no-such-command"], id="unknown-command"),
    ],
)
def test_usage_errors_exit_2_before_starting_anything(
    argv: list[str], script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(script) if arg == "SCRIPT" else arg for arg in argv]
    assert main(["tfdet", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip(), "a usage error must say what is wrong"


def test_missing_script_message_names_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tfdet", "run", "missing_script.py"]) == EXIT_USAGE
    assert "No such file: 'missing_script.py'" in capsys.readouterr().err


def test_isa_the_cpu_lacks_exits_2_in_the_parent(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_isa, "applies", lambda: True)
    monkeypatch.setattr(_isa, "cpu_flags", lambda: frozenset({"sse4_1", "avx", "avx2"}))
    assert main(["tfdet", "run", "--cpu-isa", "AVX512_CORE", str(script)]) == EXIT_USAGE
    assert "up to AVX2" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tfdet", "run", "--help"]) == 0
    assert "like python -m" in capsys.readouterr().out


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA caps are x86-64 only")
def test_lower_preset_isa_cap_survives_tfdet_run(script: Path, tmp_path: Path) -> None:
    result = run_tfdet(
        "run",
        "--seed",
        "3",
        "--threads",
        "2",
        str(script),
        env=clean_env(ONEDNN_MAX_CPU_ISA="SSE41"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = last_json_line(result.stdout)
    assert seen["env"]["ONEDNN_MAX_CPU_ISA"] == seen["profile"]["cpu_isa"] == "SSE41"
    assert "keeping SSE41" in result.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["a.py", "x"], ("script", "a.py", ["x"])),
        (["--", "a.py", "-m", "x"], ("script", "a.py", ["-m", "x"])),
        (["--", "python", "a.py", "x"], ("script", "a.py", ["x"])),
        (["--", "/usr/bin/python3.11", "a.py"], ("script", "a.py", [])),
        (
            ["--", "python3", "-m", "pkg.mod", "--help"],
            ("module", "pkg.mod", ["--help"]),
        ),
        (["python_tool.py", "x"], ("script", "python_tool.py", ["x"])),
        (["-m", "pkg", "--seed", "1"], ("module", "pkg", ["--seed", "1"])),
    ],
)
def test_command_forms(argv: list[str], expected: tuple) -> None:
    args = build_parser().parse_args(["run", *argv])
    assert _split_command(args) == expected


def test_module_in_the_working_directory_is_found_and_none_lifts_the_isa_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # The `tfdet` console script does not put the working directory on
    # sys.path, but the module will run as `python -m`, which does.
    (tmp_path / "tfdet_cwd_module.py").write_text(
        "import json, sys, tfdet\n"
        "print(json.dumps({'cpu_isa': tfdet.profile().cpu_isa}))\n"
        "sys.exit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    argv = ["tfdet", "run", "--cpu-isa", "none", "-m", "tfdet_cwd_module"]
    assert main(argv) == 3
    expected = "ALL" if _isa.applies() else _isa.NOT_APPLICABLE
    assert last_json_line(capfd.readouterr().out) == {"cpu_isa": expected}


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
def test_ctrl_c_is_the_scripts_to_handle_and_its_status_passes_through(
    tmp_path: Path,
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdet", "run", str(script)],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Its own process group, like a terminal's job.
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        os.killpg(process.pid, signal.SIGINT)  # What Ctrl-C in a terminal does.
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    # The script died of SIGINT (128 + 2, as a shell reports it), with its own
    # KeyboardInterrupt traceback only: tfdet's process just waited.
    assert process.returncode == 128 + signal.SIGINT
    assert err.count("Traceback") == 1 and "sleeper.py" in err


def test_sigterm_reaches_the_child_and_is_exit_143(tmp_path: Path) -> None:
    # `kill PID` / `timeout` signal tfdet alone: the training child must not
    # keep running under PID 1.
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdet", "run", str(script)],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = None
    try:
        assert process.stdout.readline().strip() == "ready"
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        child = int(children.read_text().split()[0])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=300) == 128 + signal.SIGTERM
        # tfdet waited for its child, so the child is gone, not orphaned.
        assert not Path(f"/proc/{child}").exists() or _zombie(child)
    finally:
        if process.poll() is None:
            process.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_scripts_own_enable_with_another_seed_names_the_flag(tmp_path: Path) -> None:
    script = tmp_path / "seeded.py"
    script.write_text("import tfdet\ntfdet.enable(seed=42)\n")
    proc = run_tfdet("run", str(script), timeout=300)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert (
        "the script asks for seed=42 but tfdet run pinned seed 0; pass "
        "--seed 42 to tfdet run" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_mismatch_message_names_every_flag() -> None:
    from tfdet._errors import ProfileMismatchError
    from tfdet._setup._launch import mismatch_message

    error = ProfileMismatchError(
        "x", {"threads": (1, 4), "cpu_isa": ("AVX2", None), "onednn": (None, False)}
    )
    assert mismatch_message(error).endswith(
        "pass --threads 4 --cpu-isa none --no-onednn to tfdet run."
    )


# A script that chooses tf_keras itself, as the tf_keras guide allows.
_TF_KERAS_SCRIPT = """
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import json
from tensorflow.keras import layers

import helper  # Beside the real file, not beside the link.


def keras_of_a_layer(_=None):
    import tensorflow as tf
    import tfdet

    # Under TF_DETERMINISTIC_OPS, an op without a seed raises.
    tf.random.uniform([])
    layer = layers.Dense(1)
    layer.build((None, 2))
    return {
        "keras": type(layer).__module__.split(".")[0],
        "seed": tfdet.profile().seed,
    }


if __name__ == "__main__":
    import multiprocessing

    # A worker pool of fresh interpreters, as a hyper-parameter search makes.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.map(keras_of_a_layer, [0])[0]
    print(json.dumps({"parent": keras_of_a_layer(), "child": child}))
"""


@pytest.mark.slow
@pytest.mark.tf_keras
def test_linked_script_its_tf_keras_choice_and_spawned_children_get_the_profile(
    tmp_path: Path,
) -> None:
    # Before: enable() imported Keras 3 before the script chose tf_keras, and
    # the script failed with a Keras 3 error (or trained another Keras than
    # `check --script`, which reads the assignment, had verified). A child
    # of a "spawn" pool inherited TF_DETERMINISTIC_OPS but no seed: its
    # first random op raised, and the pool could hang.
    # Reached through a symbolic link: its sibling module is beside the real
    # file, where `python` looks (before: ModuleNotFoundError).
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text(_TF_KERAS_SCRIPT)
    (tmp_path / "real" / "helper.py").write_text("")
    script = tmp_path / "train.py"
    script.symlink_to(tmp_path / "real" / "train.py")
    env = clean_env(TF_USE_LEGACY_KERAS=None)
    proc = run_tfdet(
        "run", "--seed", "5", str(script), env=env, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = last_json_line(proc.stdout)
    assert seen["parent"] == {"keras": "tf_keras", "seed": 5}
    assert seen["child"] == {"keras": "tf_keras", "seed": 5}
