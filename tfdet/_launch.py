"""Child side of `tfdet run`: enable tfdet, then run the user's code.

Started by `tfdet run` as `python -m tfdet._launch SETTINGS_JSON KIND TARGET
[ARGS...]` in an environment that already pins what must exist before the
interpreter starts. KIND is "script" or "module".
"""

from __future__ import annotations

import json
import runpy
import sys


def main(argv: list[str]) -> None:
    settings, kind, target, *args = argv[1:]
    import tfdet

    tfdet.enable(**json.loads(settings))
    if kind == "module":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
