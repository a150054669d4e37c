"""How each run of a script is kept from the user's files: overlays or copies.

Runs of `tfdet check --script` start together in the directory the check was
started in, and a script writes there: a checkpoint rewritten in place, a
log appended to, Keras's backup. Two ways keep each run's writes its own:

- `overlay` (preferred): each run starts in a user and mount namespace of
  its own, where the working directory, and every directory outside it
  that the tree links to, is mounted over itself as an overlay whose upper
  layer is the run's (`_overlay_launch`). The run sees the user's tree at
  its real path, as under `python`; whatever it writes there, however
  large the file and however deep, lands in its upper directory. Set-up
  costs one mount per directory, whatever the tree holds; a file costs
  disk only when a run writes it. Needs Linux 5.11 or later with
  unprivileged user namespaces (some distributions turn them off), and
  the runs' own directory outside the tree.
- `copies` (`_workdir.mirror`): each run gets a mirror of the tree, small
  files copied and the rest linked; a linked file that a run changes is
  found after the runs (`_workdir.shared_writes`), and the check fails
  instead of comparing runs that were not isolated.

`choose` takes the overlay where it can be made here (it tries it once, in
a process of its own) and says why not otherwise. The overlay covers the
tree's parent too where it can (`_layers`), as the copies give each run a
parent of its own; absolute paths elsewhere are the user's in both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence

from tfdet._protocol._perturb import RunSetup
from tfdet._runner import _overlay_launch, _workdir

OVERLAY = "overlay"
COPIES = "copies"
# The launcher, run by path: stdlib only, before tfdet is imported.
_LAUNCHER = os.path.abspath(_overlay_launch.__file__)
# Seconds the one trial mount may take.
_PROBE_TIMEOUT = 30


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The way chosen, and what it covers.

    Attributes:
        kind: `OVERLAY` or `COPIES`.
        layers: The directories each run sees through an overlay of its own
            (the tree first), or () for copies.
        reason: Why copies were used (None for the overlay).
    """

    kind: str
    layers: tuple[str, ...] = ()
    reason: str | None = None

    def describe(self) -> str:
        """One line for the report."""
        if self.kind == OVERLAY:
            return (
                "each run wrote into overlays of its own of "
                + ", ".join(self.layers)
                + ": the files there kept every byte"
            )
        return f"each run got a copy of the working directory ({self.reason})"


def _mount_points() -> list[str]:
    """Every mount point this process sees (`/proc/self/mountinfo`)."""
    points = []
    try:
        with open(
            "/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape"
        ) as mountinfo:
            for line in mountinfo:
                # Field 5 is the mount point, with a space, tab, newline or
                # backslash escaped as three octal digits (\040).
                point = line.split()[4]
                points.append(
                    re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
                )
    except OSError:
        return []
    return points


def _linked_outside(tree: str) -> tuple[set[str], str | None]:
    """The directories outside `tree` that its symbolic links lead into.

    A link to a directory gives that directory; a link to a file, the
    file's directory. Directories not the script's (`.git`, virtual
    environments, caches: `_workdir.linked_whole`) are not walked.

    Returns:
        The directories (real paths), and a reason when one cannot be
        covered (a link that leads to "/").
    """
    outside: set[str] = set()
    pending = [tree]
    while pending:
        directory = pending.pop()
        try:
            scanned = list(os.scandir(directory))
        except OSError:
            continue
        for entry in scanned:
            if entry.is_symlink():
                real = os.path.realpath(entry.path)
                if _workdir.within(real, tree) or not os.path.exists(real):
                    continue
                target = real if os.path.isdir(real) else os.path.dirname(real)
                if target == os.sep:
                    return outside, f"{entry.path} links into /"
                outside.add(target)
            elif entry.is_dir(follow_symlinks=False) and not _workdir.linked_whole(
                entry.path, entry.name
            ):
                pending.append(entry.path)
    return outside, None


def _not_overlaid(directory: str, runs: str, points: Sequence[str]) -> str | None:
    """Why `directory` cannot be overlaid for the runs, or None."""
    if directory == os.sep:
        return "it is /"
    if _workdir.within(runs, directory):
        return f"the runs' own directory {runs} lies inside {directory}"
    if _workdir.within(directory, runs):
        return f"{directory} lies inside the runs' own directory"
    # An overlay shows one file system: one mounted inside would vanish.
    mounted = [p for p in points if p != directory and _workdir.within(p, directory)]
    if mounted:
        return f"a file system is mounted inside {directory}, at {mounted[0]}"
    return None


def _layers(tree: str, runs: str) -> tuple[tuple[str, ...], str | None]:
    """The directories to overlay, or why the overlay cannot cover them.

    The tree's parent too (so that `../outputs` is the run's), where it can
    be: not where it holds the home directory, whose caches (Keras's
    downloaded data sets, tfdet's kernels) each run would fill anew.
    """
    tree = os.path.realpath(tree)
    runs = os.path.realpath(runs)
    points = _mount_points()
    why = _not_overlaid(tree, runs, points)
    if why:
        return (), why
    linked, why = _linked_outside(tree)
    if why:
        return (), why
    parent = os.path.dirname(tree)
    home = os.path.realpath(os.path.expanduser("~"))
    base = tree
    if (
        not _workdir.within(home, parent)
        and _not_overlaid(parent, runs, points) is None
    ):
        base = parent
    # A directory inside another is covered by it.
    layers = [base]
    for directory in sorted(linked, key=len):
        if not any(_workdir.within(directory, layer) for layer in layers):
            why = _not_overlaid(directory, runs, points)
            if why:
                return (), f"the tree links to {directory}, and {why}"
            layers.append(directory)
    return tuple(layers), None


def _config(layers: Sequence[str], upper_root: str) -> str:
    return json.dumps(
        {
            "layers": [
                [layer, os.path.join(upper_root, str(k), "upper"),
                 os.path.join(upper_root, str(k), "work")]
                for k, layer in enumerate(layers)
            ]
        }
    )  # fmt: skip


def _probe(layers: Sequence[str], scratch: str) -> str | None:
    """Why the overlays cannot be made here, or None when they can."""
    try:
        process = subprocess.run(
            [sys.executable, "-I", "-S", _LAUNCHER, "--probe",
             _config(layers, os.path.join(scratch, "probe"))],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the overlay could not be tried ({error})"
    if process.returncode != 0:
        said = process.stderr.strip().splitlines()
        return said[-1] if said else f"the overlay's trial exited {process.returncode}"
    return None


def choose(tree: str, runs: str, *, overlay: bool = True) -> Isolation:
    """The overlay where it can be made for `tree`, else copies.

    Args:
        tree: The directory the runs start in (the user's).
        runs: The runs' own directory (results, traces, upper layers).
        overlay: False to use copies whatever this machine allows.
    """
    if not overlay:
        return Isolation(COPIES, reason="the overlay was not asked for")
    if not sys.platform.startswith("linux"):
        return Isolation(COPIES, reason=f"no overlays on {sys.platform}")
    layers, why = _layers(tree, runs)
    if why is None:
        why = _probe(layers, runs)
    if why is not None:
        return Isolation(COPIES, reason=f"no overlay: {why}")
    return Isolation(OVERLAY, layers)


@dataclasses.dataclass
class Placement:
    """Where each run starts, and what it is started through.

    Attributes:
        directory: A run's working directory.
        prefix: The command a run's own command is started through ([]: none).
        watched: `_workdir.Mirror`s whose linked files are watched
            (`shared_writes`): the copies' (none for the overlay).
    """

    directory: Callable[[RunSetup], str]
    prefix: Callable[[RunSetup], list[str]]
    watched: list[_workdir.Mirror]

    def shared_writes(self) -> list[str]:
        """The user's files and directories that the runs changed."""
        return _workdir.shared_writes(self.watched)


def place(
    isolation: Isolation, tree: str, runs: str, setups: Sequence[RunSetup]
) -> Placement:
    """Prepares `setups`' runs of a script started in `tree` (see `choose`).

    Copies: a mirror of `tree` per run, in `runs`. Overlay: each run starts
    in `tree` itself, through the launcher, with its upper layers in
    `runs`.
    """
    if isolation.kind == COPIES:
        name = os.path.basename(tree.rstrip(os.sep)) or "root"
        mirrors = {
            setup.index: _workdir.mirror(
                tree, os.path.join(runs, f"{setup.file_stem}-parent", name), runs
            )
            for setup in setups
        }
        return Placement(
            directory=lambda setup: mirrors[setup.index].path,
            prefix=lambda setup: [],
            watched=list(mirrors.values()),
        )
    return Placement(
        directory=lambda setup: tree,
        prefix=lambda setup: [
            sys.executable,
            "-I",
            "-S",
            _LAUNCHER,
            _config(isolation.layers, os.path.join(runs, f"{setup.file_stem}.overlay")),
        ],  # fmt: skip
        watched=[],
    )
