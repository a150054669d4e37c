"""Each run's mirror of the working directory (`tfdet._runner._workdir`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tfdet._runner import _workdir


def test_past_the_entry_limit_directories_are_the_runs_own_and_files_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A project whose data directory holds more entries than the limit (a
    # lowered one: the code path is the real one), then `outputs/ckpt/`.
    # Before: directories past the limit were linked whole, so a
    # checkpoint the run wrote into `outputs/ckpt/` landed in the user's.
    monkeypatch.setattr(_workdir, "MAX_ENTRIES", 4)
    project = tmp_path / "project"
    for k in range(6):
        (project / "data").mkdir(parents=True, exist_ok=True)
        (project / "data" / f"{k}.csv").write_text(f"{k}\n")
    (project / "outputs" / "ckpt").mkdir(parents=True)
    (project / "outputs" / "ckpt" / "old.weights.h5").write_bytes(b"user's")
    run = tmp_path / "runs" / "run0-parent" / "project"

    mirror = _workdir.mirror(str(project), str(run), str(tmp_path / "runs"))

    ckpt = run / "outputs" / "ckpt"
    assert ckpt.is_dir() and not ckpt.is_symlink()
    # Files past the limit are linked, not copied, and watched.
    assert (run / "data" / "0.csv").is_symlink() is False  # Within the limit.
    assert (run / "data" / "5.csv").is_symlink()
    assert (ckpt / "old.weights.h5").is_symlink()
    assert str(project / "outputs" / "ckpt" / "old.weights.h5") in mirror.linked
    # What the run writes there is its own.
    (ckpt / "w.weights.h5").write_bytes(b"run's")
    assert sorted(os.listdir(project / "outputs" / "ckpt")) == ["old.weights.h5"]
    assert _workdir.shared_writes([mirror]) == []
