"""A child that stays alive and answers its parent's requests, one at a time.

`tfdet check` runs each child to its end: the runner starts it, follows its
progress and reads its result. `tfdet cost` needs its children alive
together, trained a block at a time in turns: each one trains N steps when
asked and answers with their times. Such a run is a `Conversation`, and it
is still started by the runner (`_spawn.run_jobs(conversations=...)`), so it
gets everything a check's run gets: `python -m tfdet._child SPEC_JSON` with
one `WorkerSpec`, its own process group, its stdin from /dev/null, its
stdout and stderr in files (the stderr tail for the error), a mirrored
working directory of its own for a script, and its result read back.

Why two pipes of tfdet's own, and not the child's stdin and stdout: a
script owns those (one reads stdin, another points fd 0 and 1 at
/dev/null), as the check's runs already found for progress. So the runner
adds one pipe, parent to child, for the requests (`WorkerSpec.requests_fd`),
and the answers come back on the run's progress channel, the pipe the
runner already reads (`_child._start.answer`): a line that is a JSON object
is an answer, any other line is progress as before. One reader per channel,
and no second protocol beside the check's.

Why the timeout is per answer here: a conversation's process lives as long
as the parent keeps asking (every block of every setting), so no limit on
its whole life fits; the runner starts it without one, and `answer` gives
each answer `timeout` seconds from the request (the first: the start, the
build and the warm-up), then kills the process as the runner would.

The parent talks from its own thread while `run_jobs` waits in another;
`end` (the request pipe closed: the child ends its work and writes its
result) or `kill` lets `run_jobs` return.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdet._errors import RunFailedError

# How often a wait for an answer wakes, so that Ctrl-C is handled.
POLL_SECONDS = 0.5


class Conversation:
    """The parent's side of one run that answers requests.

    Args:
        name: How errors name the run (`the enable() run`).
        timeout: Seconds the run may take for any one answer.
    """

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self._timeout = timeout
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._requests: Any = None
        self._kill: Callable[[], None] | None = None
        self._stderr: Callable[[], str] = str
        self._closed = False  # No more requests (ended, or the parent said so).
        self._killed = False
        self._how = ""  # How the process ended, in words.

    # --- The runner's side ---------------------------------------------------

    def started(
        self, requests_fd: int, kill: Callable[[], None], stderr: Callable[[], str]
    ) -> None:
        """The process started: `requests_fd` is the parent's end of its
        request pipe, `kill` stops it, `stderr` gives its stderr's tail."""
        with self._lock:
            self._requests = os.fdopen(requests_fd, "w", encoding="utf-8")
            self._kill, self._stderr = kill, stderr
            if self._closed:  # The parent was done before it started.
                self._close_requests()
            killed = self._killed
        if killed:
            kill()

    def received(self, line: str) -> None:
        """An answer line arrived on the run's progress channel."""
        try:
            answer = json.loads(line)
        except ValueError:
            answer = {"error": f"an unreadable answer: {line[:200]!r}"}
        self._answers.put(answer)

    def ended(self, how: str) -> None:
        """The process ended, `how` in words (`exited 1`); every answer it
        wrote has been received."""
        with self._lock:
            self._how = how
            self._closed = True
            self._close_requests()
        self._answers.put(None)

    # --- The parent's side ---------------------------------------------------

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Sends `request` and returns the answer (see `answer`)."""
        with self._lock:
            requests = self._requests
        if requests is not None:
            # A run that ended closed its end: its answer says so.
            with contextlib.suppress(OSError, ValueError):
                requests.write(json.dumps(request) + "\n")
                requests.flush()
        return self.answer()

    def answer(self) -> dict[str, Any]:
        """The run's next answer.

        Raises:
            RunFailedError: it ended before it answered, or did not answer
                within `timeout` seconds (it is killed then).
        """
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                answer = self._answers.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RunFailedError(
                        f"the {self.name} run did not answer within "
                        f"{self._timeout:g} s (`timeout`): a step that hangs, "
                        "or a build slower than that."
                    ) from None
        if answer is None:
            self._answers.put(None)  # Every later wait sees the end too.
            tail = self._stderr()
            raise RunFailedError(
                f"the {self.name} run ended ({self._how}) "
                "before it answered." + (f" Its output ends:\n{tail}" if tail else "")
            )
        return answer

    def end(self) -> None:
        """No more requests: the child ends its work and writes its result."""
        with self._lock:
            self._closed = True
            self._close_requests()

    def kill(self) -> None:
        """Stops the run now (its process group)."""
        with self._lock:
            kill = self._kill
            self._closed = self._killed = True
            self._close_requests()
        if kill is not None:
            kill()

    def _close_requests(self) -> None:
        if self._requests is not None:
            with contextlib.suppress(OSError, ValueError):
                self._requests.close()
            self._requests = None
