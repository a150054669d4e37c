"""A run's process: its environment, its process group, its neighbour.

The environment a run starts from (`run_environment`, `child_environment`),
the process group that `kill_tree` stops whole, and the CPU-burning
neighbour process that a perturbation may start beside a run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from tfdet._protocol._perturb import RunSetup
from tfdet._target import _load


def run_environment(spec: _load.TargetSpec, device: str) -> dict[str, str]:
    """The environment the runs of TARGET on `device` start from."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if spec.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if device == "cpu":
        # Hide GPUs so that CPU runs are really on the CPU.
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    else:
        # Concurrent runs share the GPU: none may take all its memory.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        # TensorFlow wheels may ship PTX only for a new GPU (2.21: compute_90),
        # which the driver compiles at first use and caches on disk; its
        # default cache (256 MiB) can be too small to keep TensorFlow's
        # kernels, so every fresh run compiled them again. A user's own
        # setting stays.
        env.setdefault("CUDA_CACHE_MAXSIZE", str(CUDA_CACHE_MAXSIZE))
    return env


# The CUDA driver's largest JIT cache, in bytes (4 GiB).
CUDA_CACHE_MAXSIZE = 4 * 1024**3


def child_environment(
    base: dict[str, str], overrides: dict[str, str | None]
) -> dict[str, str]:
    """`base` with `overrides` applied (None unsets a variable)."""
    env = dict(base)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class ProcessGroup:
    """The processes of one run (one, or every worker of a multi-worker run).

    Each child starts in its own session (process group), so killing it also
    kills anything the TARGET spawned. The first process of the group that
    fails stops the others: the workers of a multi-worker run wait on each
    other in collectives, so one dead worker would leave the rest hanging
    until the timeout. An interrupt or an error in the parent stops every
    group, CPU-burning neighbours included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen] = []
        self.stopped = threading.Event()
        self.first_failure: RunSetup | None = None

    def start(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self.stopped.is_set():
                raise RuntimeError("tfdet: runs were stopped before this one started")
            process = subprocess.Popen(command, start_new_session=True, **kwargs)
            self._processes.append(process)
            return process

    def fail(self, setup: RunSetup) -> None:
        """Records that `setup`'s process failed (if first) and stops the rest."""
        with self._lock:
            if self.first_failure is None and not self.stopped.is_set():
                self.first_failure = setup
        self.stop_all()

    def stop_all(self) -> None:
        with self._lock:
            self.stopped.set()
            for process in self._processes:
                kill_tree(process)


def kill_tree(process: subprocess.Popen) -> None:
    """Kills a child started with `start_new_session=True` and its descendants."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# Named so that a process listing (and the no-survivors test) can tell tfdet's
# neighbour from any other busy loop on the machine.
NEIGHBOUR_CODE = "# tfdet cpu-burning neighbour\nwhile True:\n    pass"


def _burn(group: ProcessGroup) -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return group.start(
        [sys.executable, "-c", NEIGHBOUR_CODE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Neighbour:
    """The CPU-burning neighbour of a run, from the moment the run trains.

    It starts when the run reports its TARGET built (a script: its first
    `fit`, `train_on_batch` or optimizer step), not with the process:
    TensorFlow's start-up, which no perturbation of training reaches, would
    only be slowed by it (about 4 CPU-seconds a run). `stop` ends it, and one
    that would start after that never does. A neighbour that could not start
    is an error `stop` raises: the run would otherwise be reported as
    perturbed.
    """

    def __init__(self, group: ProcessGroup):
        self._group = group
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._error: OSError | None = None
        self._stopped = False

    def start(self) -> None:
        """Starts it, once (called from the thread that reads the progress)."""
        with self._lock:
            if self._process is not None or self._stopped or self._error:
                return
            try:
                self._process = _burn(self._group)
            except RuntimeError:  # The runs are being stopped.
                self._stopped = True
            except OSError as error:
                self._error = error

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            process = self._process
        if process is not None:
            kill_tree(process)
            process.wait()
        if self._error is not None:
            raise self._error
