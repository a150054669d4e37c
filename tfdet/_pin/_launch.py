"""Child side of `tfdet run`: enable tfdet, then run the user's code.

Started by `tfdet run` as `python -m tfdet._pin._launch SETTINGS_JSON KIND TARGET
[ARGS...]` in an environment that already pins what must exist before the
interpreter starts. KIND is "script" or "module".
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def main(argv: list[str]) -> None:
    """Enables tfdet with the JSON settings, then runs the script or module."""
    settings, kind, target, *args = argv[1:]
    import tfdet

    tfdet.enable(**json.loads(settings))
    sys.argv = [target, *args]
    if kind == "module":
        # As `python -m`: sys.path[0] stays the working directory.
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        # As `python script.py`: sys.path[0] is the script's directory, not
        # the working directory that `python -m tfdet._pin._launch` put there.
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
