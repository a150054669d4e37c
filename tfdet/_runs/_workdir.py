"""A working directory of its own for each run of a script.

`python train.py` resolves relative paths against the directory it was
started in: a script reads `data/train.csv` there and writes `bk/` (Keras's
BackupAndRestore), `ckpt.weights.h5` (ModelCheckpoint) or `logs/` there.
Runs that share that directory share those files: run 1 restores run 0's
backup, or both open one HDF5 file. So each run gets a mirror of it: the
same directories, created anew (what a run creates is its own); small files
copied (what a run rewrites is its own); large files, and directories that
are not the script's data (`.git`, virtual environments, `node_modules`,
`__pycache__`) or beyond `MAX_ENTRIES`, linked (read as they are, never
copied).

A linked file is still shared: `shared_writes` lists those a run changed,
and the check then fails instead of comparing runs that were not isolated.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

# Files up to this size are copied into each run's directory; larger ones
# (data sets, weights) are linked.
MAX_COPIED_BYTES = 1 << 20
# Entries mirrored one by one at most; deeper directories are linked whole.
MAX_ENTRIES = 20_000
# Directory names linked whole: not what a training script writes into.
_LINKED_WHOLE = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Mirror:
    """A run's directory and the files it shares with the original.

    Attributes:
        path: The run's working directory.
        linked: `{path in the original: (size, mtime_ns)}` of each file
            linked, as it was before the run.
    """

    path: str
    linked: dict[str, tuple[int, int]]


def _linked_whole(path: str, name: str) -> bool:
    return name in _LINKED_WHOLE or os.path.exists(os.path.join(path, "pyvenv.cfg"))


def mirror(source: str, destination: str, exclude: str) -> Mirror:
    """Makes `destination` a mirror of directory `source` (see the module doc).

    `exclude` (tfdet's own directory of the runs, which may lie inside
    `source`) is left out.
    """
    linked: dict[str, tuple[int, int]] = {}
    entries = 0
    os.makedirs(destination, exist_ok=True)
    for root, directories, files in os.walk(source):
        target_root = os.path.join(destination, os.path.relpath(root, source))
        kept = []
        for name in sorted(directories):
            path = os.path.join(root, name)
            if os.path.abspath(path) == os.path.abspath(exclude):
                continue
            entries += 1
            if (
                os.path.islink(path)
                or _linked_whole(path, name)
                or entries > MAX_ENTRIES
            ):
                os.symlink(path, os.path.join(target_root, name))
            else:
                os.mkdir(os.path.join(target_root, name))
                kept.append(name)
        directories[:] = kept
        for name in sorted(files):
            path = os.path.join(root, name)
            entries += 1
            try:
                stat = os.stat(path)
            except OSError:  # A dangling link: mirrored as it is.
                os.symlink(os.readlink(path), os.path.join(target_root, name))
                continue
            if stat.st_size <= MAX_COPIED_BYTES and entries <= MAX_ENTRIES:
                shutil.copy2(path, os.path.join(target_root, name))
            else:
                os.symlink(path, os.path.join(target_root, name))
                linked[path] = (stat.st_size, stat.st_mtime_ns)
    return Mirror(destination, linked)


def shared_writes(mirrors: list[Mirror]) -> list[str]:
    """The linked files (shared by every run) that changed since they were linked."""
    changed = set()
    for run in mirrors:
        for path, before in run.linked.items():
            try:
                stat = os.stat(path)
            except OSError:
                changed.add(path)
                continue
            if (stat.st_size, stat.st_mtime_ns) != before:
                changed.add(path)
    return sorted(changed)


def inside(path: str, directory: str) -> str | None:
    """`path` relative to `directory` when it lies inside it, else None."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(directory))
    return None if relative.startswith(os.pardir) else relative
