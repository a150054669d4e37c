"""Everything the CLI writes to stdout and stderr goes through here.

The verdict must not depend on whether anyone reads the output: a closed
stdout (`>&-`), a reader that went away (`| head -3`) or a pipe nobody reads
must not turn "identical" into a crash, a failed run or a hang. So:

- A write that fails (BrokenPipeError, any OSError, a stream that is None
  because its descriptor was closed at start) is dropped, and the stream is
  pointed at /dev/null, as the Python docs recommend for SIGPIPE, so that
  the interpreter's own flush at exit does not fail again.
- Progress lines are best-effort: one that would block (a full pipe nobody
  reads) is dropped instead of stalling a run's reader thread.
- After a signal, the last message is written only if it cannot block: the
  runs' reader threads may be stuck in a write holding the stream's lock.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading

_lock = threading.Lock()


def _silence(name: str) -> None:
    """Points `sys.<name>` at /dev/null after its descriptor failed."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        stream = getattr(sys, name)
        fileno = stream.fileno() if stream is not None else None
        if fileno is not None:
            os.dup2(devnull, fileno)
            os.close(devnull)
        else:
            setattr(sys, name, os.fdopen(devnull, "w"))


def _write(name: str, text: str) -> bool:
    stream = getattr(sys, name)
    if stream is None:  # The descriptor was closed when Python started.
        return False
    try:
        stream.write(text + "\n")
        stream.flush()
        return True
    except (OSError, ValueError):  # BrokenPipeError, EBADF, closed file.
        _silence(name)
        return False


# Set by `--json -`: stdout then carries the JSON report alone, so the human
# report goes to stderr.
_human_to_stderr = False


def reserve_stdout_for_json() -> None:
    """Sends `out()` to stderr from now on: stdout is for `--json -`."""
    global _human_to_stderr
    _human_to_stderr = True


def out(text: str) -> bool:
    """Prints the human report `text` to stdout; returns whether it got there."""
    return _write("stderr" if _human_to_stderr else "stdout", text)


def json_out(text: str) -> bool:
    """Prints a `--json -` report to stdout; returns whether it got there."""
    return _write("stdout", text)


def err(text: str) -> bool:
    """Prints `text` to stderr; returns whether it got there."""
    return _write("stderr", text)


def _writable_now(stream: object) -> bool:
    """Whether a short write to `stream` cannot block (pipes only may)."""
    try:
        fileno = stream.fileno()  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        return True  # No descriptor (a test's capture): cannot block on a pipe.
    try:
        _, ready, _ = select.select([], [fileno], [], 0)
    except (OSError, ValueError):
        return False
    return bool(ready)


def progress(text: str) -> None:
    """A progress line on stderr, dropped rather than blocking or failing.

    A pipe that `select` reports writable has room for at least PIPE_BUF
    bytes, and a line shorter than that is written whole, so the write
    cannot block; the lock keeps two runs' threads from both relying on the
    same free room.
    """
    if len(text) >= 512:
        text = text[:508] + "..."
    with _lock:
        if _writable_now(sys.stderr):
            _write("stderr", text)


def last_words(text: str) -> None:
    """Writes a final stderr message after a signal, only if it cannot block.

    Bypasses `sys.stderr` (whose lock a blocked reader thread may hold) and
    writes the descriptor directly.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fileno = 2
        _, ready, _ = select.select([], [fileno], [], 0)
        if ready:
            os.write(fileno, (text + "\n").encode("utf-8", errors="replace"))


def flush_at_exit() -> None:
    """Flushes both streams; a reader that went away is not an error."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            _silence(name)
