"""What tfdet computes once per machine and keeps: `$XDG_CACHE_HOME/tfdet`.

`~/.cache/tfdet` where `XDG_CACHE_HOME` is not set. It holds tfdet's
compiled kernels (`kernels/`, unless `TFDET_KERNEL_CACHE` names another
directory) and where TensorFlow's libraries keep the variables tfdet pins
(`symbols/`), each entry keyed by everything it depends on. An entry that
cannot be read or written is computed again, never an error: a read-only
home directory only makes tfdet slower to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def directory() -> Path:
    """tfdet's cache directory (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfdet"


def read_json(path: Path) -> Any | None:
    """The JSON value kept at `path`, or None where there is none to read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Keeps `value` at `path` whole or not at all (a reader never sees half
    of it: written beside it, then renamed over it); a failure is ignored."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=path.parent, suffix=".partial")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(value, file)
            os.replace(partial, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
