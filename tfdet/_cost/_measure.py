"""Runs every setting of `tfdet cost` in its own process, interleaved.

The processes of a round start together and warm up (tracing, first oneDNN
primitives; not timed), then take turns: in each block one process at a time
trains `steps` steps while the others wait, the order rotating every block.
A block's ratio to plain TensorFlow compares steps timed seconds apart, so
the load of a shared machine hits every setting alike; the report gives the
median over blocks of these ratios, and their middle half. After the blocks
each process reports its weights' digest (with several rounds, equal
digests say that a setting gave the same bits in every fresh process), then
profiles a few steps per op type (first round only).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tfdet._cost import _report, _settings
from tfdet._cost._settings import Setting
from tfdet._errors import RunFailedError, TargetError
from tfdet._pin import _environment, _isa
from tfdet._runs import _spawn

# Profiled steps per setting: enough to average the per-op times, few enough
# not to matter next to the timed blocks.
PROFILED_STEPS = 3
# A line from a worker must come within this many seconds (TensorFlow's
# start, the TARGET's build and the warm-up come before the first).
ANSWER_TIMEOUT = 600.0

Progress = Callable[[str], None]


def cores() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class _Worker:
    """One setting in its own fresh process, answering the parent's requests."""

    def __init__(
        self, setting: Setting, target: str, warmup: int, env: dict[str, str], logs: str
    ) -> None:
        self.setting = setting
        spec = {"target": target, "setting": setting.to_dict(), "warmup": warmup}
        self._log = os.path.join(logs, f"{len(os.listdir(logs))}.stderr")
        with open(self._log, "wb") as stderr:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tfdet._cost._worker",
                    json.dumps(spec | {"seed": 0}),
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # Killed with whatever it started.
            )

    def _answer(self) -> dict[str, Any]:
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            tail = _spawn.stderr_tail(self._log)
            raise RunFailedError(
                f"tfdet cost: the {self.setting.name} run ended "
                f"({_spawn.describe_exit(self._process.returncode)}) before it "
                "answered." + (f" Its output ends:\n{tail}" if tail else "")
            )
        return json.loads(line)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def ready(self) -> dict[str, Any]:
        """The worker's first answer: built, warmed up, its profile."""
        answer = self._answer()
        if "error" in answer:
            raise TargetError(answer["error"])
        return answer

    def close(self) -> None:
        _spawn.kill_tree(self._process)
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        self._process.wait()
        self._process.stdout.close()


def _environment_for_runs(target_spec: Any) -> dict[str, str]:
    """The CPU runs' environment, without the caller's determinism variables:
    plain TensorFlow means plain, and each setting pins its own."""
    env = _spawn.run_environment(target_spec, "cpu")
    for name in _environment.DETERMINISM_VARIABLES:
        env.pop(name, None)
    return env


def _shares(
    ops: dict[str, dict[str, Any]], ms_per_step: float
) -> dict[str, dict[str, Any]]:
    """Each op type's share of a step: its profiled time, scaled so that the
    ops add up to the step's measured time.

    The profiler times each op from start to end on the thread that ran it;
    with several inter-op threads ops overlap, and their times add up to
    more than the step. Scaled, one thread's ops and two threads' compare.
    """
    total = sum(op["ms"] for op in ops.values())
    if total <= 0:
        return {}
    return {
        kind: {**op, "ms": op["ms"] * ms_per_step / total} for kind, op in ops.items()
    }


def measure(
    target: str,
    settings: list[Setting] | None = None,
    *,
    rounds: int = 1,
    blocks: int = 4,
    steps: int = 5,
    warmup: int = 3,
    progress: Progress | None = None,
) -> _report.CostReport:
    """Times `target` under each setting, interleaved; see the module doc.

    Args:
        target: The TARGET string (`builtin:cnn`, `path/to/file.py:fn`, ...).
        settings: Plain TensorFlow first (the ratios' baseline), then the
            settings to compare; None: `_settings.settings_for(cores())`.
        rounds: Rounds of fresh processes.
        blocks: Interleaved blocks per round.
        steps: Timed steps per process per block.
        warmup: Untimed steps per process before the first block.
        progress: Called with a line of text per event.

    Raises:
        TargetError: the TARGET cannot be built.
        RunFailedError: a run ended before it answered.
    """
    from tfdet._runs import _target

    available = cores()
    settings = _settings.settings_for(available) if settings is None else settings
    say = progress or (lambda text: None)
    target_spec = _target.parse(target)
    env = _environment_for_runs(target_spec)
    ready: dict[str, dict[str, Any]] = {}
    per_block: list[dict[str, float]] = []
    digests: dict[str, list[str]] = {setting.name: [] for setting in settings}
    ops: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tfdet-cost-") as logs:
        for round_ in range(rounds):
            say(
                f"round {round_ + 1}/{rounds}: starting TensorFlow in "
                f"{len(settings)} processes, one per setting"
            )
            workers = [
                _Worker(setting, target, warmup, env, logs) for setting in settings
            ]
            try:
                for worker in workers:
                    ready[worker.setting.name] = worker.ready()
                for block in range(blocks):
                    shift = (round_ * blocks + block) % len(workers)
                    medians = {
                        worker.setting.name: statistics.median(
                            worker.ask({"steps": steps})["ms"]
                        )
                        for worker in workers[shift:] + workers[:shift]
                    }
                    per_block.append(medians)
                    say(
                        f"round {round_ + 1}/{rounds} block {block + 1}/{blocks}: "
                        + ", ".join(
                            f"{setting.name} {medians[setting.name]:.1f}"
                            for setting in settings
                        )
                        + " ms/step"
                    )
                # Every process has trained the same steps: equal digests
                # across rounds mean repeatable bits.
                for worker in workers:
                    digests[worker.setting.name].append(
                        worker.ask({"digest": True})["digest"]
                    )
                if round_ == 0:
                    say(f"profiling {PROFILED_STEPS} steps per setting")
                    for worker in workers:
                        ops[worker.setting.name] = worker.ask(
                            {"profile": PROFILED_STEPS}
                        )["ops"]
            finally:
                for worker in workers:
                    worker.close()
    baseline = settings[0].name
    rows = []
    for setting in settings:
        name = setting.name
        ratios = sorted(block[name] / block[baseline] for block in per_block)
        xla = bool(ready[name]["xla"])
        ms_per_step = statistics.median(block[name] for block in per_block)
        rows.append(
            _report.CostRow(
                setting=setting,
                ms_per_step=ms_per_step,
                ratio=statistics.median(ratios),
                ratio_q1=ratios[len(ratios) // 4],
                ratio_q3=ratios[(3 * len(ratios)) // 4],
                xla=xla,
                bits_follow=tuple(_settings.bits_follow(ready[name]["profile"], xla)),
                digests=tuple(digests[name]),
                ops=_shares(ops[name], ms_per_step),
                note=None
                if not setting.jit_compile or xla
                else "Keras turned jit_compile off (no deterministic XLA path "
                "for a layer under op determinism): timed without XLA",
            )
        )
    return _report.CostReport(
        target=target,
        cores=available,
        cpu_model=_isa.cpu_model(),
        rounds=rounds,
        blocks=blocks,
        steps=steps,
        warmup=warmup,
        rows=tuple(rows),
    )
