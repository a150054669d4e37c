"""Child side of `tfdet run`: enable tfdet, then run the user's code.

Started by `tfdet run` as `python -m tfdet._setup._launch SETTINGS_JSON KIND TARGET
[ARGS...]` in an environment that already pins what must exist before the
interpreter starts. KIND is "script" or "module".

A process the script starts with `multiprocessing`'s "spawn" or
"forkserver" method is enabled with the same settings (`_spawned`).
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from tfdet import _variables
from tfdet._errors import EXIT_USAGE, ProfileMismatchError
from tfdet._setup import _spawned

# `tfdet run`'s flag for each profile setting a script's own enable() may ask for.
_FLAGS = {"seed": "--seed", "threads": "--threads", "cpu_isa": "--cpu-isa"}


def mismatch_message(error: ProfileMismatchError) -> str:
    """What to pass to `tfdet run` so that the script's enable() agrees."""
    asked, pinned, fixes = [], [], []
    for key, (active, requested) in error.differences.items():
        asked.append(f"{key}={requested!r}")
        pinned.append(f"{key} {active!r}")
        if key in _FLAGS:
            value = "none" if key == "cpu_isa" and requested is None else requested
            fixes.append(f"{_FLAGS[key]} {value}")
        elif key == "onednn" and requested is not None:
            fixes.append("--onednn" if requested else "--no-onednn")
    fix = (
        f"pass {' '.join(fixes)} to tfdet run"
        if len(fixes) == len(asked)
        else "call enable() in the script with the settings tfdet run pinned"
    )
    return (
        f"the script asks for {', '.join(asked)} but tfdet run pinned "
        f"{', '.join(pinned)}; {fix}."
    )


def main(argv: list[str]) -> None:
    """Enables tfdet with the JSON settings, then runs the script or module."""
    settings, kind, target, *args = argv[1:]
    from tfdet import _notices
    from tfdet._setup._enable import enable

    if os.environ.get(_variables.VERBOSE) != "1":  # `tfdet --verbose run`
        _notices.hide_at_import()

    enable(**json.loads(settings))
    _spawned.give_spawned_children_the_profile(settings)
    sys.argv = [target, *args]
    try:
        _run(kind, target)
    except ProfileMismatchError as error:
        # The script's own enable() asks for other settings than the flags:
        # a usage error of `tfdet run`, not a crash of the script.
        sys.stderr.write(f"tfdet: error: {mismatch_message(error)}\n")
        sys.exit(EXIT_USAGE)


def _run(kind: str, target: str) -> None:
    if kind == "module":
        # As `python -m`: sys.path[0] stays the working directory.
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        # As `python script.py`: sys.path[0] is the directory of the
        # script's real file (a symbolic link resolved, so its sibling
        # modules import), not the working directory that `python -m
        # tfdet._setup._launch` put there.
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
