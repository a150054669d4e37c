"""Each run of a script kept from the user's files (`tfdet._runner._isolation`).

The overlay: each run in a user and mount namespace of its own, the tree
mounted over itself with the run's upper layer. Where this machine refuses
one (no unprivileged user namespaces), those tests skip and say why; the
copies' tests are in test_workdir.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_tfdet, tree_digest

from tfdet._runner import _isolation


@pytest.fixture
def overlay_allowed(tmp_path_factory) -> None:
    """Skips where this machine cannot give a run an overlay."""
    tree = tmp_path_factory.mktemp("probe-tree")
    runs = tmp_path_factory.mktemp("probe-runs")
    isolation = _isolation.choose(str(tree), str(runs))
    if isolation.kind != _isolation.OVERLAY:
        pytest.skip(f"no overlay here: {isolation.reason}")


def test_the_layers_are_the_tree_its_parent_and_the_directories_it_links_to(
    tmp_path: Path,
) -> None:
    project = tmp_path / "work" / "project"
    (project / "data").mkdir(parents=True)
    scratch = tmp_path / "scratch" / "outputs"
    scratch.mkdir(parents=True)
    (project / "outputs").symlink_to(scratch)  # A scratch disk's directory.
    weights = tmp_path / "store" / "w.h5"
    weights.parent.mkdir()
    weights.write_bytes(b"w")
    (project / "data" / "w.h5").symlink_to(weights)  # A linked file.
    (project / "self").symlink_to(project / "data")  # Inside: covered.
    (project / "gone").symlink_to(tmp_path / "nowhere")  # Dangling: nothing.
    runs = tmp_path / "runs"
    runs.mkdir()

    layers, why = _isolation._layers(str(project), str(runs))

    assert why is None
    assert layers == (
        str(tmp_path / "work"),  # The parent: `../outputs` is the run's.
        str(tmp_path / "store"),
        str(scratch),
    )


def test_a_tree_that_holds_the_runs_directory_is_not_overlaid(tmp_path: Path):
    # The upper layers live in the runs' directory: inside the lower one,
    # overlayfs refuses (and the runs' results would vanish into it).
    layers, why = _isolation._layers(str(tmp_path), str(tmp_path / "runs"))
    assert layers == () and "lies inside" in why
    # Nor its parent, when the runs' directory is beside the tree.
    (tmp_path / "tree").mkdir()
    layers, why = _isolation._layers(str(tmp_path / "tree"), str(tmp_path / "runs"))
    assert why is None and layers == (str(tmp_path / "tree"),)


def test_a_directory_with_a_file_system_mounted_inside_is_not_overlaid():
    points = _isolation._mount_points()
    holders = sorted(
        {os.path.dirname(p) for p in points} - {os.sep} - set(points), key=len
    )
    if not holders:
        pytest.skip("no mount point below another directory than / here")
    why = _isolation._not_overlaid(holders[0], "/nonexistent-runs", points)
    assert why is not None and "mounted inside" in why


def test_a_link_into_the_root_gets_copies(tmp_path: Path):
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "everything").symlink_to("/")
    layers, why = _isolation._layers(str(tmp_path / "tree"), "/nonexistent-runs")
    assert layers == () and "links into /" in why


def test_copies_when_asked_say_so(tmp_path: Path):
    isolation = _isolation.choose(str(tmp_path), "/nonexistent", overlay=False)
    assert isolation.kind == _isolation.COPIES
    assert "not asked for" in isolation.describe()


def test_a_command_in_the_overlay_rewrites_creates_and_removes_only_its_own(
    tmp_path: Path, overlay_allowed
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ckpt.bin").write_bytes(b"\0" * 4096)
    (tree / "old.log").write_text("user's\n")
    runs = tmp_path / "runs"
    before = tree_digest(tree)
    config = _isolation._config([str(tree)], str(runs / "run0.overlay"))
    code = (
        "import os\n"
        "with open('ckpt.bin', 'r+b') as f: f.write(b'run')\n"
        "open('old.log', 'a').write('run\\n')\n"
        "open('new.txt', 'w').write('run')\n"
        "os.remove('old.log')\n"
        "print(sorted(os.listdir('.')), open('ckpt.bin', 'rb').read(3))\n"
    )
    process = subprocess.run(
        [sys.executable, "-I", "-S", _isolation._LAUNCHER, config,
         sys.executable, "-c", code],
        cwd=tree, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    # The command saw its own writes...
    assert process.stdout.strip() == "['ckpt.bin', 'new.txt'] b'run'"
    # ...and the user's tree kept every byte.
    assert tree_digest(tree) == before
    assert sorted(os.listdir(tree)) == ["ckpt.bin", "old.log"]
    upper = runs / "run0.overlay" / "0" / "upper"
    assert (upper / "ckpt.bin").read_bytes()[:3] == b"run"


def test_a_launcher_that_cannot_mount_says_why_and_exits_125(tmp_path: Path):
    config = json.dumps({"layers": [[str(tmp_path / "missing"), "u", "w"]]})
    process = subprocess.run(
        [sys.executable, "-I", "-S", _isolation._LAUNCHER, "--probe", config],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert process.returncode == 125
    assert "could not isolate this run in overlays" in process.stderr


# Rewrites a large checkpoint in place, appends to a log that lies past the
# copies' entry limit, and writes `../outputs/`, as training scripts do;
# then trains, so that there is something to compare.
_REWRITING_SCRIPT = """
import os
import keras
import numpy as np

with open("ckpt/model.ckpt", "r+b") as f:
    f.write(os.urandom(4096))
with open("data/zz/train.log", "a") as f:
    f.write("appended by a run\\n")
os.makedirs("../outputs", exist_ok=True)
with open("../outputs/metrics.json", "w") as f:
    f.write("{}")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0)
"""


@pytest.mark.slow
def test_a_script_that_rewrites_large_and_deep_files_leaves_the_tree_byte_identical(
    tmp_path: Path, overlay_allowed
) -> None:
    project = tmp_path / "work" / "project"
    (project / "ckpt").mkdir(parents=True)
    with open(project / "ckpt" / "model.ckpt", "wb") as f:
        f.write(os.urandom(50 << 20))  # 50 MB: linked, never copied, before.
    data = project / "data"
    for k in range(20_001):  # Past the copies' 20,000 entries.
        sub = data / f"{k // 1000:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{k}.txt").write_text(str(k))
    (data / "zz").mkdir()
    (data / "zz" / "train.log").write_text("user's log\n")
    (project / "train.py").write_text(_REWRITING_SCRIPT)
    before = tree_digest(tmp_path / "work")
    report_path = tmp_path / "report.json"

    proc = run_tfdet(
        "check", "--script", "train.py", "--perturb", "none",
        "--json", str(report_path), cwd=project,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert report["isolation"].startswith("each run wrote into overlays of its own")
    assert report["shared_writes"] == []
    assert tree_digest(tmp_path / "work") == before
    assert sorted(os.listdir(tmp_path / "work")) == ["project"]

    # The control: the same check with copies writes the user's checkpoint
    # (linked, being over 1 MiB), and only then fails naming it.
    proc = run_tfdet(
        "check", "--script", "train.py", "--perturb", "none", "--copies",
        "--json", str(report_path), cwd=project,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert str(project / "ckpt" / "model.ckpt") in report["shared_writes"]
    assert tree_digest(tmp_path / "work") != before


def test_mount_points_read_escaped_names_as_they_are(tmp_path, monkeypatch):
    # /proc/self/mountinfo escapes a space as \040; other characters (UTF-8)
    # come as they are.
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "36 35 98:0 / /mnt/my\\040disk/ü rw,noatime master:1 - ext3 /dev/root rw\n",
        encoding="utf-8",
    )
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *a, **k: real_open(
            mountinfo if path == "/proc/self/mountinfo" else path, *a, **k
        ),
    )
    assert _isolation._mount_points() == ["/mnt/my disk/ü"]
