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
import dataclasses
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdet._commands._options import DEFAULT_TIMEOUT
from tfdet._cost import _advice, _report, _settings
from tfdet._cost._settings import Setting
from tfdet._errors import RunFailedError, TargetError
from tfdet._pin import _environment, _isa
from tfdet._runner import _spawn, _workdir

# Profiled steps per setting: enough to average the per-op times, few enough
# not to matter next to the timed blocks.
PROFILED_STEPS = 3
# How often a wait for a worker's answer wakes, so that Ctrl-C is handled.
_POLL_SECONDS = 0.5

Progress = Callable[[str], None]


def cores() -> int:
    """The CPUs this process may use."""
    return len(_environment.affinity() or []) or os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every setting trains: a TARGET, or a whole script.

    Attributes:
        target: The TARGET string (`builtin:cnn`, `path/to/file.py:fn`, ...).
        script: A training script run whole instead, from a copy of the
            working directory of its own per setting.
        args: The script's arguments.
    """

    target: str | None = None
    script: str | None = None
    args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.script is None:
            return str(self.target)
        return " ".join(["--script", self.script, *self.args])

    def spec(self) -> dict[str, Any]:
        """The worker's view. A script inside the working directory goes by its
        path relative to it, so that it runs from the setting's own copy."""
        if self.script is None:
            return {"target": self.target}
        relative = _workdir.inside(self.script, os.getcwd())
        return {
            "script": relative or os.path.abspath(self.script),
            "args": list(self.args),
        }


class _Worker:
    """One setting in its own fresh process, answering the parent's requests."""

    def __init__(
        self,
        setting: Setting,
        workload: Workload,
        warmup: int,
        env: dict[str, str],
        logs: str,
        cwd: str | None,
        timeout: float,
    ) -> None:
        self.setting = setting
        self._timeout = timeout
        self.finished = False  # A script that ended by itself.
        spec = {
            **workload.spec(),
            "setting": setting.to_dict(),
            "warmup": warmup,
            "seed": 0,
        }
        self._log = os.path.join(logs, f"{len(os.listdir(logs))}.stderr")
        with open(self._log, "wb") as stderr:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tfdet._cost._worker", json.dumps(spec)],
                env=env,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # Killed with whatever it started.
            )
        # Read on a thread of its own, so that a wait can time out.
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put("")  # The process closed its end: it is gone.

    def _answer(self) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                line = self._lines.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.close()
                    raise RunFailedError(
                        f"tfdet cost: the {self.setting.name} run did not answer "
                        f"within {self._timeout:g} s (--timeout): a step that hangs, "
                        "or a build slower than that."
                    ) from None
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
        answer = self._answer()
        self.finished = self.finished or bool(answer.get("finished"))
        return answer

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


def _environment_for_runs(workload: Workload) -> dict[str, str]:
    """The CPU runs' environment, without the caller's determinism variables:
    plain TensorFlow means plain, and each setting pins its own."""
    from tfdet._target import _load

    env = _spawn.run_environment(_load.parse(workload.target), "cpu")
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


@dataclasses.dataclass
class _Figures:
    """What the rounds collect, per setting name."""

    ready: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    per_block: list[dict[str, float]] = dataclasses.field(default_factory=list)
    digests: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    ops: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def _round(
    workers: list[_Worker],
    figures: _Figures,
    round_: int,
    blocks: int,
    steps: int,
    say: Progress,
    more_blocks: Callable[[], bool] = lambda: False,
) -> None:
    """One round: the blocks in turn, the digests, while `more_blocks()` one
    more block (after the digests, so that every round's digests cover the
    same steps), then the profile (round 0)."""
    for worker in workers:
        figures.ready[worker.setting.name] = worker.ready()
    label = f"round {round_ + 1}"

    def block(index: int, of: str) -> bool:
        """Times one block; False when a script ended during it."""
        shift = (round_ * blocks + index) % len(workers)
        times = {
            worker.setting.name: worker.ask({"steps": steps})["ms"]
            for worker in workers[shift:] + workers[:shift]
        }
        if any(worker.finished for worker in workers):
            # A script ended: this block is short, and there is no next.
            say(f"{label}: the script ended during block {index + 1}; kept {index}")
            return False
        medians = {name: statistics.median(ms) for name, ms in times.items()}
        figures.per_block.append(medians)
        say(
            f"{label} block {index + 1}{of}: "
            + ", ".join(
                f"{w.setting.name} {medians[w.setting.name]:.1f}" for w in workers
            )
            + " ms/step"
        )
        return True

    ended = not all(block(index, f"/{blocks}") for index in range(blocks))
    # Every process has trained the same steps: equal digests across rounds
    # mean repeatable bits.
    for worker in workers:
        digest = worker.ask({"digest": True})["digest"]
        if digest is not None:
            figures.digests.setdefault(worker.setting.name, []).append(digest)
    extra = blocks
    while not ended and more_blocks():
        ended = not block(extra, " (beyond --blocks: the advice is inconclusive)")
        extra += 1
    if round_ == 0:
        say(f"profiling {PROFILED_STEPS} steps per setting")
        for worker in workers:
            answer = worker.ask({"profile": PROFILED_STEPS})
            figures.ops[worker.setting.name] = answer.get("ops") or {}


def measure(
    workload: Workload | str,
    settings: list[Setting] | None = None,
    *,
    rounds: int = 1,
    blocks: int = 4,
    steps: int = 5,
    warmup: int = 3,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
    need: tuple[str, ...] = _report.DEFAULT_NEED,
) -> _report.CostReport:
    """Times `workload` under each setting, interleaved; see the module doc.

    Args:
        workload: What to train: a `Workload`, or a TARGET string.
        settings: Plain TensorFlow first (the ratios' baseline), then the
            settings to compare; None: `_settings.settings_for(cores())`
            (without XLA for a script, which compiles its own models).
        rounds: Rounds of fresh processes.
        blocks: Interleaved blocks per round.
        steps: Timed steps per process per block.
        warmup: Untimed steps per process before the first block.
        timeout: Seconds a run may take to give any one answer (its start,
            build and warm-up come before the first) before it is killed.
        progress: Called with a line of text per event.
        need: The tiers to advise for (`tfdet._pin._tiers` names): while
            the blocks cannot tell its candidates apart, the last round runs
            more blocks, up to `_advice.blocks_bound`.

    Raises:
        TargetError: the TARGET cannot be built, or the script trains too
            few steps for the warm-up and one block.
        RunFailedError: a run ended before it answered.
    """
    if isinstance(workload, str):
        workload = Workload(target=workload)
    available = cores()
    if settings is None:
        settings = _settings.settings_for(available, xla=workload.script is None)
    say = progress or (lambda text: None)
    env = _environment_for_runs(workload)
    figures = _Figures()
    launched_in = os.getcwd()

    def report() -> _report.CostReport:
        return _report.CostReport(
            target=workload.name,
            cores=available,
            cpu_model=_isa.cpu_model(),
            rounds=rounds,
            blocks=blocks,
            steps=steps,
            warmup=warmup,
            rows=tuple(
                _row(setting, figures, settings[0].name) for setting in settings
            ),
            per_block=tuple(figures.per_block),
            need=need,
        )

    def more_blocks() -> bool:
        return len(figures.per_block) < _advice.blocks_bound(
            rounds * blocks
        ) and _advice.undecided(report().advice())

    with tempfile.TemporaryDirectory(prefix="tfdet-cost-") as logs:
        for round_ in range(rounds):
            say(
                f"round {round_ + 1}/{rounds}: starting TensorFlow in "
                f"{len(settings)} processes, one per setting"
            )
            workers = []
            try:
                for index, setting in enumerate(settings):
                    cwd = None
                    if workload.script is not None:
                        # As `tfdet check --script`: a copy of the working
                        # directory each, so no two settings share a file.
                        name = os.path.basename(launched_in.rstrip(os.sep)) or "root"
                        parent = os.path.join(logs, f"r{round_}s{index}-parent")
                        cwd = _workdir.mirror(
                            launched_in, os.path.join(parent, name), logs
                        ).path
                    workers.append(
                        _Worker(setting, workload, warmup, env, logs, cwd, timeout)
                    )
                last = round_ == rounds - 1
                _round(
                    workers,
                    figures,
                    round_,
                    blocks,
                    steps,
                    say,
                    more_blocks if last else lambda: False,
                )
            finally:
                for worker in workers:
                    worker.close()
    if not figures.per_block:
        raise TargetError(
            f"Expected the script to train {warmup} warm-up steps and a block of "
            f"{steps} more. Received: it ended before. Use fewer --steps or "
            "--warmup, or give the script more steps."
        )
    return report()


@dataclasses.dataclass(frozen=True)
class BlockFigures:
    """One setting's timing over the blocks (see `block_figures`)."""

    ms_per_step: float
    ratio: float
    ratio_q1: float
    ratio_q3: float


def block_figures(
    per_block: list[dict[str, float]], name: str, baseline: str
) -> BlockFigures:
    """The figures `tfdet cost` and the benchmarks report for `name`.

    Args:
        per_block: Per block, each setting's median ms/step in that block.
        name: The setting.
        baseline: The setting the ratios are to (plain TensorFlow).

    Returns:
        The median over blocks of its ms/step; the median over blocks of its
        ratio to `baseline` *in the same block* (not the ratio of the two
        medians: a load that slows one block slows both of its terms), and
        the middle half of those block ratios.
    """
    ratios = sorted(block[name] / block[baseline] for block in per_block)
    return BlockFigures(
        ms_per_step=statistics.median(block[name] for block in per_block),
        ratio=statistics.median(ratios),
        ratio_q1=ratios[len(ratios) // 4],
        ratio_q3=ratios[(3 * len(ratios)) // 4],
    )


def _row(setting: Setting, figures: _Figures, baseline: str) -> _report.CostRow:
    """One setting's row: its block figures, XLA, profile, digests and ops."""
    name = setting.name
    timing = block_figures(figures.per_block, name, baseline)
    xla = bool(figures.ready[name]["xla"])
    return _report.CostRow(
        setting=setting,
        **dataclasses.asdict(timing),
        xla=xla,
        bits_follow=tuple(_settings.bits_follow(figures.ready[name]["profile"], xla)),
        tiers=tuple(_settings.tiers(figures.ready[name]["profile"], xla)),
        digests=tuple(figures.digests.get(name, [])),
        ops=_shares(figures.ops.get(name, {}), timing.ms_per_step),
        note=None
        if not setting.jit_compile or xla
        else "Keras turned jit_compile off (no deterministic XLA path for a "
        "layer under op determinism): timed without XLA",
    )
