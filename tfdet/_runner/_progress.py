"""The progress pipe: a child's step lines, read as they come.

A child writes its progress (steps done, the stage it reached) on a pipe of
its own; these read it while the run goes and hand each line on.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable

from tfdet._protocol import _spec
from tfdet._runner._conversation import Conversation


def forward_progress(
    raw: bytes,
    index: int,
    progress: Callable[[int, int, int], None] | None,
    stages: list[str],
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> None:
    """Passes one `DONE TOTAL` line on, keeps a stage line in `stages`, and
    gives an answer line to the run's `conversation` (when it has one).

    `on_training` is called when the run says it trains: its TARGET built, a
    script's first training call, or a step done. Anything else is ignored.
    """
    line = raw.decode("utf-8", errors="replace").strip()
    if conversation is not None and line.startswith(_spec.ANSWER_START):
        conversation.received(line)
        return
    if line in _spec.STAGES:
        stages.append(line)
        if line in (_spec.BUILT, _spec.TRAINING) and on_training is not None:
            on_training()
        return
    parts = line.split()
    if len(parts) == 2 and all(part.isdigit() for part in parts):
        if on_training is not None:
            on_training()
        if progress is None:
            return
        # Progress is for people: a failure to show it (a closed stderr)
        # must not make the run a failure.
        with contextlib.suppress(Exception):
            progress(index, int(parts[0]), int(parts[1]))


def follow_progress(
    read_fd: int,
    index: int,
    progress: Callable[[int, int, int], None] | None,
    stages: list[str],
    ended: threading.Event,
    conversation: Conversation | None = None,
    on_training: Callable[[], None] | None = None,
) -> threading.Thread:
    """Reads the progress pipe until it closes, or `ended` is set and it is idle.

    `ended` is set when the run's own process exited: a process it started
    (or forked) may still hold the pipe open, and must not keep the run going.
    """

    def follow() -> None:
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([read_fd], [], [], 0.2)
                if not ready:
                    if ended.is_set():
                        return
                    continue
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    return
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    forward_progress(
                        line, index, progress, stages, conversation, on_training
                    )
        finally:
            os.close(read_fd)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread
