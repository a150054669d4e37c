"""A working directory of its own for each run of a script.

`python train.py` resolves relative paths against the directory it was
started in: a script reads `data/train.csv` there and writes `bk/` (Keras's
BackupAndRestore), `ckpt.weights.h5` (ModelCheckpoint) or `logs/` there.
Runs that share that directory share those files: run 1 restores run 0's
backup, or both open one HDF5 file. So each run gets a mirror of it: the
same directories, created anew (what a run creates is its own), symbolic
links to directories elsewhere (a scratch disk's output directory) included;
small regular files copied (what a run rewrites is its own); large files,
FIFOs, sockets and devices, the directories that are not the script's data
(`.git`, virtual environments, `node_modules`, `__pycache__`), and every
file past the first `MAX_ENTRIES` entries, linked (read as they are, never
copied). Past that limit directories are still created anew, however many:
a file a run creates (a checkpoint under `outputs/ckpt/`) is in its own
directory whatever the size of the tree; the limit bounds what is copied,
not what is walked (one link per file and one directory per directory of
the tree, for each run). Each mirror sits in a parent directory of the
run's own that links the original's siblings, so `../data` reads as under
`python`.

A linked file (or a directory linked because it loops back to one
mirrored already) is still shared: `shared_writes` lists those a run
changed (for a directory: an entry created, removed or renamed in it), and
the check then fails instead of comparing runs that were not isolated.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import stat

# Files up to this size are copied into each run's directory; larger ones
# (data sets, weights) are linked.
MAX_COPIED_BYTES = 1 << 20
# Entries whose small files are copied at most; past them every file is
# linked (directories are still created: see the module doc).
MAX_ENTRIES = 20_000
# Directory names linked whole: not what a training script writes into.
_LINKED_WHOLE = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Mirror:
    """A run's directory and the files it shares with the original.

    Attributes:
        path: The run's working directory.
        linked: `{path in the original: (size, mtime_ns)}` of each file and
            directory linked, as it was before the run (a directory's mtime
            changes when an entry is created, removed or renamed in it).
    """

    path: str
    linked: dict[str, tuple[int, int]]


def linked_whole(path: str, name: str) -> bool:
    """Whether directory `path` (named `name`) is not the script's data."""
    return name in _LINKED_WHOLE or os.path.exists(os.path.join(path, "pyvenv.cfg"))


def within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies inside it (both real paths)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def mirror(source: str, destination: str, exclude: str) -> Mirror:
    """Makes `destination` a mirror of directory `source` (see the module doc).

    `exclude` (tfdet's own directory of the runs, which may lie inside
    `source`) is left out. A symbolic link to a directory elsewhere (an
    output directory on a scratch disk, say) is mirrored as a directory of
    the run's own; one to a directory inside `source` stays a link, to the
    mirror's copy. Only regular files are copied: a FIFO, a socket or a
    device is linked (copying one blocks, fails or never ends).

    The parent of `destination` (a directory of the run's own: give it one)
    gets a link to each entry beside `source` in its parent, so that
    `../data/train.csv` reads as under `python`; what a run creates in `..`
    is its own, what it writes into a linked sibling is shared.
    """
    real_source = os.path.realpath(source)
    real_exclude = os.path.realpath(exclude)
    linked: dict[str, tuple[int, int]] = {}
    entries = 0
    os.makedirs(destination, exist_ok=True)
    _link_siblings(source, destination, real_exclude)
    # Directories to mirror: (original, its real path, its copy), and the
    # real paths seen (a link that loops back is not followed twice).
    pending = collections.deque([(source, real_source, destination)])  # Shallow first.
    seen = {real_source}
    device = os.stat(source).st_dev
    while pending:
        root, real_root, target_root = pending.popleft()
        with os.scandir(root) as scanned:
            listed = sorted(scanned, key=lambda entry: entry.name)
        for entry in listed:
            path, target = entry.path, os.path.join(target_root, entry.name)
            # Resolved only for a link: an entry's own real path is its real
            # parent's plus its name (most of a large tree's entries).
            if entry.is_symlink():
                real = os.path.realpath(path)
            else:
                real = os.path.join(real_root, entry.name)
            if real == real_exclude:
                continue
            entries += 1
            if entry.is_dir():  # Follows a link.
                if entry.is_symlink() and within(real, real_source):
                    # An alias inside the tree: the same alias in the copy.
                    relative = os.path.relpath(real, real_source)
                    os.symlink(os.path.join(destination, relative), target)
                elif linked_whole(path, entry.name) or (
                    not entry.is_symlink() and entry.stat().st_dev != device
                ):
                    # Not the script's (.git, caches), or another file system
                    # mounted in the tree (/proc, /sys, /dev from "/").
                    os.symlink(path, target)
                elif real in seen:
                    # A loop: shared, watched for new entries.
                    os.symlink(path, target)
                    linked[path] = _stamp(path)
                else:
                    seen.add(real)
                    os.mkdir(target)
                    pending.append((path, real, target))
                continue
            try:
                info = os.stat(path)
            except OSError:  # A dangling link: mirrored as it is.
                os.symlink(os.readlink(path), target)
                continue
            regular = stat.S_ISREG(info.st_mode)
            if regular and info.st_size <= MAX_COPIED_BYTES and entries <= MAX_ENTRIES:
                shutil.copy2(path, target)
            else:
                os.symlink(path, target)
                if regular:
                    linked[path] = (info.st_size, info.st_mtime_ns)
    return Mirror(destination, linked)


def _stamp(path: str) -> tuple[int, int]:
    """`(size, mtime_ns)` of `path`, as `Mirror.linked` records it."""
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def _link_siblings(source: str, destination: str, real_exclude: str) -> None:
    """Links each entry beside `source` into the parent of `destination`."""
    parent = os.path.dirname(os.path.abspath(source))
    name = os.path.basename(os.path.abspath(source))
    if not name:  # Started from "/": there is no parent.
        return
    target_parent = os.path.dirname(destination)
    try:
        siblings = sorted(os.listdir(parent))
    except OSError:
        return
    for sibling in siblings:
        path = os.path.join(parent, sibling)
        target = os.path.join(target_parent, sibling)
        if sibling == name or os.path.realpath(path) == real_exclude:
            continue
        if not os.path.lexists(target):
            os.symlink(path, target)


def shared_writes(mirrors: list[Mirror]) -> list[str]:
    """The linked files and directories (shared by every run) that changed."""
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
