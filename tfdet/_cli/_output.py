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


def _is_terminal(name: str) -> bool:
    stream = getattr(sys, name)
    try:
        return bool(stream is not None and stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


# Lines per run when stderr is not a terminal: a log gets the first step,
# every tenth of the run and the last, not one line per step.
PIPED_LINES_PER_RUN = 10


class StepsDisplay:
    """Progress of concurrent runs on stderr: in place on a terminal.

    On a terminal, one line per device (`[cpu] run 0: 12/200  run 1:
    11/200`) is rewritten in place with `\\r`. Elsewhere (a pipe, a CI log)
    each run gets plain lines at its first step, at every tenth of its steps
    and at its last: a log of a long check stays short, and nothing depends
    on timing. Messages (`message`) end an in-place line first. Like
    `progress`, nothing here ever blocks a run or fails it.
    """

    def __init__(self, indent: str = "  ") -> None:
        self._indent = indent
        self._terminal = _is_terminal("stderr")
        self._steps: dict[str, dict[int, tuple[int, int]]] = {}
        self._open = ""  # The device whose line is in place, unterminated.
        self._width = 0

    def _end_line(self) -> None:
        if self._open:
            self._raw("\n")
            self._open = ""
            self._width = 0

    def _raw(self, text: str) -> None:
        stream = sys.stderr
        if stream is None or not _writable_now(stream):
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            _silence("stderr")

    def message(self, text: str) -> None:
        """A line of its own (a stage, a header)."""
        with _lock:
            self._end_line()
        progress(f"{self._indent}{text}")

    def step(self, device: str, index: int, done: int, total: int) -> None:
        """Run `index` on `device` finished step `done` of `total`."""
        runs = self._steps.setdefault(device, {})
        runs[index] = (done, total)
        if not self._terminal:
            every = max(1, total // PIPED_LINES_PER_RUN)
            if done in (1, total) or done % every == 0:
                progress(f"{self._indent}[{device}] run {index}: step {done}/{total}")
            return
        line = f"{self._indent}[{device}] " + "  ".join(
            f"run {i}: {d}/{t}" for i, (d, t) in sorted(runs.items())
        )
        with _lock:
            if self._open and self._open != device:
                self._end_line()
            # Spaces wipe what a longer previous line left behind.
            self._raw("\r" + line.ljust(self._width))
            self._open, self._width = device, max(self._width, len(line))

    def finish(self) -> None:
        """Ends an in-place line, so that the report starts on its own."""
        with _lock:
            self._end_line()
