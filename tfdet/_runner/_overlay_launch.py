"""Starts a command inside overlays of the user's directories (stdlib only).

    python -I -S _overlay_launch.py CONFIG_JSON COMMAND...
    python -I -S _overlay_launch.py --probe CONFIG_JSON

Run by path, before anything of tfdet or TensorFlow is imported: a user
namespace can only be made by a process of one thread, and QEMU's user-mode
emulator (a run's launcher) starts threads of its own. It makes a user and
mount namespace of its own (Linux 5.11 and later let an unprivileged user
mount overlayfs there), mounts each layer's directory over itself as an
overlay whose upper directory is the run's, enters its working directory
again (through the overlay), and executes COMMAND. The overlays are seen by
COMMAND and whatever it starts, and by no other process: what the run
writes under a layer (a checkpoint rewritten in place, a log appended to,
a file created or removed) lands in the run's upper directory, and the
user's files keep every byte.

The namespace maps the user's own uid and gid to themselves, so files keep
their owner; a file whose owner or group is someone else's cannot be
copied up, and a write to it fails (EOVERFLOW).

CONFIG_JSON: `{"layers": [[directory, upper, work], ...]}`. With `--probe`,
it mounts and exits 0 without running anything. Exit 125 and a line on
stderr (this is a process's entry point, before any logging exists) when
the overlays cannot be made.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
# This file's exit status when it could not make the overlays.
EXIT_NO_OVERLAY = 125


class _Failed(Exception):
    pass


def _call(result: int, what: str) -> None:
    if result != 0:
        raise _Failed(f"{what}: {os.strerror(ctypes.get_errno())}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def _escaped(path: str) -> str:
    # overlayfs splits its options at commas and its lower layers at colons.
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def enter(layers: list[list[str]]) -> None:
    """Makes the namespace and mounts each layer (see the module doc)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    _call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare a user namespace")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as error:
        raise _Failed(f"map the user's ids: {error}") from error
    # Mounts made here stay here (not propagated to the user's namespace).
    _call(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "private mounts")
    for directory, upper, work in layers:
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        options = (
            f"lowerdir={_escaped(directory)},upperdir={_escaped(upper)},"
            f"workdir={_escaped(work)}"
        )
        # userxattr: the overlay's own attributes as user.* ones, which a
        # user namespace may write (Linux 5.11); without it where older.
        for extra in (",userxattr", ""):
            mounted = libc.mount(
                b"overlay",
                os.fsencode(directory),
                b"overlay",
                0,
                os.fsencode(options + extra),
            )
            if mounted == 0:
                break
        _call(mounted, f"mount an overlay on {directory}")
    # The working directory was entered before the mounts: enter it again,
    # through them.
    os.chdir(os.getcwd())


def main(argv: list[str]) -> int:
    probe = argv[1:2] == ["--probe"]
    config = json.loads(argv[2] if probe else argv[1])
    try:
        enter(config["layers"])
    except (_Failed, OSError) as error:
        print(
            f"tfdet: could not isolate this run in overlays ({error})", file=sys.stderr
        )
        return EXIT_NO_OVERLAY
    if probe:
        return 0
    command = argv[2:]
    os.execvp(command[0], command)
    return EXIT_NO_OVERLAY  # Not reached: execvp returns only by raising.


if __name__ == "__main__":
    sys.exit(main(sys.argv))
