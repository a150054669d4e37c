"""TensorFlow's C++ start-up notices, and hiding them while TensorFlow loads.

Loading TensorFlow's shared libraries prints lines before its C++ logging
is set up, so `TF_CPP_MIN_LOG_LEVEL` does not silence them: absl's "All log
messages before absl::InitializeLog() is called are written to STDERR", the
oneDNN notice, the CPU feature guard and, on CUDA builds, "Unable to
register cuDNN factory" and the like; some appear twice (one per library).
They say nothing about the bits, so tfdet's commands hide them unless
`--verbose`, and keep them out of a failed run's stderr tail.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

# A notice: absl's pre-initialization warning; an INFO line of TensorFlow's
# C++ logging (`I0000 00:00:... port.cc:153] ...`); the CPU feature guard's
# second line; the CUDA plugins' duplicate-registration lines (logged as W or
# E, but harmless); TF-TRT's missing-TensorRT warning. Other W and E lines
# may be real problems and are kept.
NOTICE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|[WE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] (Unable to register "
    r"|computation placer already registered|TF-TRT Warning: Could not find))"
    # QEMU's emulator, for CPU features of a model its code generator lacks.
    r"|qemu-x86_64: warning: TCG doesn't support requested feature"
)


def without_notices(text: str) -> str:
    """`text` without the lines that are TensorFlow start-up notices."""
    return "".join(
        line for line in text.splitlines(keepends=True) if not NOTICE.match(line)
    )


# The filter process: copies its stdin to its stdout, line by line, but
# the notices. A process, not a thread: if TensorFlow's import kills this
# one (an illegal instruction, a failed check in C++), the message that
# says why must still get out.
_FILTER = """
import re, sys
notice = re.compile(sys.argv[1])
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not notice.match(line.decode("utf-8", "replace")):
        out.write(line)
        out.flush()
"""


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    """Sends descriptor 2 through a filter of the notices meanwhile.

    At the descriptor level, because the notices are written by C++, not
    through `sys.stderr`. Everything else written meanwhile (a Python
    warning, a crash message) goes through, in order.
    """
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # Descriptor 2 was closed at start: nothing to hide.
        yield
        return
    try:
        # Its own session: Ctrl-C is for this process, which then closes
        # the filter's input, and the filter ends.
        filter_ = subprocess.Popen(
            [sys.executable, "-c", _FILTER, NOTICE.pattern],
            stdin=subprocess.PIPE,
            stdout=saved,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        os.close(saved)
        yield
        return
    assert filter_.stdin is not None  # stdin=PIPE
    os.dup2(filter_.stdin.fileno(), 2)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        filter_.stdin.close()
        filter_.wait()


class _QuietLoader(importlib.abc.Loader):
    """Runs the real loader of `tensorflow` inside `hidden()`."""

    def __init__(self, loader: Any, finder: _Finder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        spec = module.__spec__
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        try:
            with hidden():
                self._loader.exec_module(module)
        finally:
            # Later imports and reloads see TensorFlow's own loader.
            spec.loader = module.__loader__ = self._loader


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the first import of `tensorflow` in `hidden()`, then leaves.

    It leaves when the import runs, not when it is first asked: a probe such
    as `importlib.util.find_spec("tensorflow")` (tfdet's cache-size pin
    locates the library so) asks without importing, and a finder gone by
    then would leave the import that follows loud.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self)
        return spec


def hide_at_import() -> None:
    """Hides the notices when TensorFlow is first imported in this process.

    Does nothing when TensorFlow is already imported (the notices are out).
    """
    if "tensorflow" in sys.modules or any(
        isinstance(finder, _Finder) for finder in sys.meta_path
    ):
        return
    sys.meta_path.insert(0, _Finder())
