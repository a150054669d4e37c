"""Runs every setting of `tfdet cost` in its own process, interleaved.

The processes of a round start together and warm up (tracing, first oneDNN
primitives; not timed), then take turns: in each block one process at a time
trains `steps` steps while the others wait, the order rotating every block.
A block's ratio to plain TensorFlow compares steps timed seconds apart, so
the load of a shared machine hits every setting alike; the report gives the
median over blocks of these ratios, and their middle half. After the blocks
each process reports its weights' digest (with several rounds, equal
digests say that a setting gave the same bits in every fresh process, unless
they say why they cannot tell: `_repeat`), then profiles a few steps per op
type (first round only).

The processes are children of the `cost` kind (`tfdet._child._cost_worker`),
started by the runner as `tfdet check`'s are (`_spawn.run_all`), each with a
`Conversation` the parent asks over pipes of tfdet's own; a script's each
in an overlay or a copy of the working directory of its own (`_isolation`),
as under `tfdet check --script`.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdet._commands._options import DEFAULT_TIMEOUT, RunOptions
from tfdet._cost import _advice, _cost_report, _timed_settings
from tfdet._cost._timed_settings import Setting
from tfdet._errors import RunFailedError, TargetError
from tfdet._pin import _cpus, _devices, _environment, _isa
from tfdet._protocol import _spec
from tfdet._protocol._perturb import RunSetup
from tfdet._protocol._result import CostResult
from tfdet._runner import _isolation, _outcome, _preflight, _process, _spawn, _workdir
from tfdet._runner._conversation import Conversation
from tfdet._setup import _coverage

# The schedule's defaults (the CLI's too): about a minute on the built-in CNN
# on 2 cores.
DEFAULT_ROUNDS = 1
DEFAULT_BLOCKS = 4
DEFAULT_STEPS = 5
DEFAULT_WARMUP = 3
# Profiled steps per setting: enough to average the per-op times, few enough
# not to matter next to the timed blocks.
PROFILED_STEPS = 3
_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"

Progress = Callable[[str], None]


# `device`'s choices: a GPU where TensorFlow lists one, else the CPU; or one.
AUTO = "auto"
DEVICE_CHOICES = (AUTO, *_timed_settings.DEVICES)


def resolve_device(device: str) -> str:
    """Where the runs of `measure` train, from one of `DEVICE_CHOICES`.

    Raises:
        ValueError: `device` is not one of them.
        DeviceUnavailableError: "gpu" on a machine without one (exit 4).
    """
    if device not in DEVICE_CHOICES:
        raise ValueError(
            f"Expected `device` to be one of {', '.join(DEVICE_CHOICES)}. "
            f"Received: {device!r}"
        )
    if device == "gpu":
        _devices.require_gpu()
    if device == AUTO:
        return "gpu" if _devices.gpu_visible() else "cpu"
    return device


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


def _spec_for(setting: Setting, workload: Workload, warmup: int) -> _spec.WorkerSpec:
    """The `cost` child's spec for `setting`: its `enable()` keyword
    arguments are `RunOptions` fields (each default stated there once)."""
    options = RunOptions(enable=setting.enable is not None, **(setting.enable or {}))
    return options.worker_spec(
        _spec.COST,
        **workload.spec(),
        warmup=warmup,
        jit_compile=setting.jit_compile,
        op_determinism=setting.op_determinism,
    )


class _Worker:
    """One setting's process, which the parent asks to train in turns."""

    def __init__(self, setting: Setting, timeout: float) -> None:
        self.setting = setting
        self.conversation = Conversation(setting.name, timeout)
        self.finished = False  # A script that ended by itself.
        self._ready: dict[str, Any] | None = None

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.conversation.ask(request)
        self.finished = self.finished or bool(answer.get("finished"))
        return answer

    def ready(self) -> dict[str, Any]:
        """The worker's first answer: built, warmed up, its profile (waited
        for at the first call)."""
        if self._ready is None:
            answer = self.conversation.answer()
            if "error" in answer:
                raise TargetError(answer["error"])
            self._ready = answer
        return self._ready


class _Processes:
    """The processes of a round's settings in `part` (one per setting),
    started together by the runner (`_spawn.run_all` with a `Conversation`
    each, in a thread of its own while this one talks to them); see
    `tfdet._runner._conversation`."""

    def __init__(
        self,
        workers: list[_Worker],
        specs: list[_spec.WorkerSpec],
        first_index: int,
        workdir: str,
        env: dict[str, str],
        placement: _isolation.Placement | None,
        part: slice = slice(None),
    ) -> None:
        workers, specs = workers[part], specs[part]
        first_index += part.start or 0
        self.workers = workers
        self.outcomes: list[_outcome.RunOutcome] = []
        setups = [RunSetup(first_index + k) for k in range(len(workers))]

        def slot(setup: RunSetup) -> int:
            return setup.index - first_index

        def run() -> None:
            self.outcomes = _spawn.run_all(
                setups,
                lambda setup: specs[slot(setup)],
                workdir,
                base_env=env,
                # Unused: a conversation's run is timed per answer.
                timeout=DEFAULT_TIMEOUT,
                directory=None if placement is None else placement.directory,
                prefix=None if placement is None else placement.prefix,
                conversations=lambda setup: workers[slot(setup)].conversation,
            )

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self, stop: bool, grace: float = 0.0) -> list[_outcome.RunOutcome]:
        """Ends every process, waits for them, and returns their outcomes.

        Without `stop`, each is told there are no more requests and has
        `grace` seconds to write its result and exit; then, or at once with
        `stop`, what is left is killed.
        """
        if not stop:
            for worker in self.workers:
                worker.conversation.end()
            deadline = time.monotonic() + grace
            while self._thread.is_alive() and time.monotonic() < deadline:
                self._thread.join(_spawn.JOIN_POLL_SECONDS)
        if stop or self._thread.is_alive():
            for worker in self.workers:
                worker.conversation.kill()
        _spawn.join_interruptibly(self._thread)
        return self.outcomes


def _close(
    processes: list[_Processes], stop: bool, grace: float = 0.0
) -> list[_outcome.RunOutcome]:
    """`_Processes.close` of each group; every outcome.

    Every process is told to end before any is waited for, and the groups
    share one `grace`: closed one after the other, the second group would
    hear only once the first had exited, and could wait a second `grace`.
    """
    if not stop:
        for group in processes:
            for worker in group.workers:
                worker.conversation.end()
    deadline = time.monotonic() + grace
    return [
        outcome
        for group in processes
        for outcome in group.close(stop, max(0.0, deadline - time.monotonic()))
    ]


def _environment_for_runs(workload: Workload, device: str) -> dict[str, str]:
    """The runs' environment on `device` ("cpu": GPUs hidden; "gpu": as
    `tfdet check --device gpu` gives its runs), without the caller's
    determinism variables:
    plain TensorFlow means plain, and each setting pins its own. The Keras
    stays the workload's: a script's choice is read from it, as `check
    --script` reads it, and the caller's `TF_USE_LEGACY_KERAS` is kept."""
    from tfdet._target import _load

    spec = (
        _load.parse(workload.target)
        if workload.script is None
        else _load.TargetSpec(
            "script", legacy_keras=_load.sets_legacy_keras(workload.script)
        )
    )
    env = _process.run_environment(spec, device)
    keras_choice = env.get(_LEGACY_KERAS)
    for name in _environment.DETERMINISM_VARIABLES:
        env.pop(name, None)
    if keras_choice is not None:
        env[_LEGACY_KERAS] = keras_choice
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
    # Per round, each process's answer to `digest`.
    digests: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    ops: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # The largest peak resident memory (MB) any of its processes reported
    # while timed (not while profiled: the profiler's buffers are not the
    # setting's).
    peak_mb: dict[str, float] = dataclasses.field(default_factory=dict)


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
        answers = {
            worker.setting.name: worker.ask({"steps": steps})
            for worker in workers[shift:] + workers[:shift]
        }
        times = {name: answer["ms"] for name, answer in answers.items()}
        for name, answer in answers.items():
            if answer.get("peak_mb") is not None:
                figures.peak_mb[name] = max(
                    figures.peak_mb.get(name, 0.0), float(answer["peak_mb"])
                )
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
    # mean repeatable bits (`_repeat`).
    for worker in workers:
        answer = worker.ask({"digest": True})
        figures.digests.setdefault(worker.setting.name, []).append(answer)
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
    rounds: int = DEFAULT_ROUNDS,
    blocks: int = DEFAULT_BLOCKS,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
    need: tuple[str, ...] | None = None,
    device: str = "cpu",
    xla: bool = True,
) -> _cost_report.CostReport:
    """Times `workload` under each setting, interleaved; see the module doc.

    Args:
        workload: What to train: a `Workload`, or a TARGET string.
        settings: Plain TensorFlow first (the ratios' baseline), then the
            settings to compare; None: `_timed_settings.settings_for` of
            `_cpus.usable_cpus()` on the CPU,
            `gpu_settings_for` on the GPU (without XLA for a script, which
            compiles its own models).
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
        device: Where the runs train, 'cpu' or 'gpu' (`resolve_device`).
        xla: Whether the default settings include XLA's (never for a
            script, which compiles its own models).

    Raises:
        TargetError: the TARGET cannot be built, or the script trains too
            few steps for the warm-up and one block.
        RunFailedError: a run ended before it answered.
    """
    if isinstance(workload, str):
        workload = Workload(target=workload)
    available = _cpus.usable_cpus()
    if settings is None:
        xla = xla and workload.script is None
        settings = (
            _timed_settings.settings_for(available, xla)
            if device == "cpu"
            else _timed_settings.gpu_settings_for(available, xla)
        )
    say = progress or (lambda text: None)
    env = _environment_for_runs(workload, device)
    specs = [_spec_for(setting, workload, warmup) for setting in settings]
    figures = _Figures()
    own_copies: set[str] = set()  # A script's paths each run had its own copy of.
    launched_in = os.getcwd()

    def report() -> _cost_report.CostReport:
        # Where the runs really trained (they all start alike).
        trained = figures.ready[settings[0].name]
        return _cost_report.CostReport(
            target=workload.name,
            cores=available,
            cpu_model=_isa.cpu_model(),
            device=trained["device"],
            device_name=trained["device_name"],
            rounds=rounds,
            blocks=blocks,
            steps=steps,
            warmup=warmup,
            rows=tuple(
                _row(setting, figures, settings[0].name) for setting in settings
            ),
            per_block=tuple(figures.per_block),
            need=need or _cost_report.default_need(trained["device"]),
        )

    def more_blocks() -> bool:
        return len(figures.per_block) < _advice.blocks_bound(
            rounds * blocks
        ) and _advice.undecided(report().advice())

    with tempfile.TemporaryDirectory(prefix="tfdet-cost-") as workdir:
        isolation = (
            None if workload.script is None else _isolation.choose(launched_in, workdir)
        )
        for round_ in range(rounds):
            say(
                f"round {round_ + 1}/{rounds}: starting TensorFlow in "
                f"{len(settings)} processes, one per setting"
                + (" (the first alone, until it has built)" if round_ == 0 else "")
            )
            first = round_ * len(settings)
            placement = None
            if isolation is not None:
                # As `tfdet check --script`: an overlay or a copy of the
                # working directory each, so no two settings share a file.
                placement = _isolation.place(
                    isolation,
                    launched_in,
                    workdir,
                    [RunSetup(first + k) for k in range(len(settings))],
                )
            workers = [_Worker(setting, timeout) for setting in settings]

            # The first round's first setting starts alone: a TARGET that
            # cannot be built, a script that fails or a run that hangs is
            # then said from one process, not after TensorFlow started in
            # one per setting. Once it has built, the others start.
            group = (workers, specs, first, workdir, env, placement)
            processes = [
                _Processes(*group, slice(0, 1) if round_ == 0 else slice(None))
            ]
            try:
                if round_ == 0:
                    workers[0].ready()
                    processes.append(_Processes(*group, slice(1, None)))
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
            except RunFailedError:
                outcomes = _close(processes, stop=True)
                if workload.script is None:
                    # A TARGET that cannot be built (exit 2) says so first.
                    # A run that timed out (or that this parent stopped) says
                    # nothing about the TARGET: each answer is timed, so it
                    # may have been starting TensorFlow still.
                    _preflight.raise_unbuilt_target(
                        [outcome for outcome in outcomes if not outcome.timed_out],
                        workload.name,  # The TARGET (no script here).
                        timeout,
                    )
                raise
            except BaseException:
                _close(processes, stop=True)
                raise
            outcomes = _close(processes, stop=False, grace=timeout)
            own_copies.update(
                path
                for outcome in outcomes
                if isinstance(outcome.result, CostResult)
                for path in outcome.result.own_copies
            )
    for path in sorted(own_copies):
        say(
            f"{path}: outside the working directory, so each setting's run kept "
            "its own copy (training state a resume reads back)"
        )
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


def _repeat(answers: list[dict[str, Any]]) -> tuple[tuple[str, ...], str | None]:
    """A setting's digests over the rounds, or why they cannot say whether
    it repeated its bits: `(digests, why)`."""
    unknown = [answer["why"] for answer in answers if answer.get("digest") is None]
    if unknown:
        return (), unknown[0]
    steps = sorted({answer.get("steps") for answer in answers}, key=str)
    if len(steps) > 1:
        return (), (
            "its processes trained different step counts before the digest ("
            + ", ".join(map(str, steps))
            + "): the script chose them"
        )
    return tuple(answer["digest"] for answer in answers), None


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


def _row(setting: Setting, figures: _Figures, baseline: str) -> _cost_report.CostRow:
    """One setting's row: its block figures, XLA, profile, digests and ops."""
    name = setting.name
    timing = block_figures(figures.per_block, name, baseline)
    ready = figures.ready[name]
    xla, device = bool(ready["xla"]), ready["device"]
    digests, unknown = _repeat(figures.digests.get(name, []))
    profile, ops = ready["profile"], figures.ops.get(name, {})
    # What the profile promises, less what the model ran against it: as the
    # child measured it (the log of `enable()`), else from the profiled ops.
    if ready.get("coverage") is not None:
        coverage = _coverage.Coverage.from_dict(ready["coverage"])
    else:
        coverage = _coverage.of(profile, ops, xla=xla, device=device)
    return _cost_report.CostRow(
        setting=setting,
        **dataclasses.asdict(timing),
        xla=xla,
        bits_follow=tuple(_timed_settings.bits_follow(profile, xla, device, coverage)),
        tiers=tuple(_timed_settings.tiers(profile, xla, device, coverage)),
        digests=digests,
        same_bits_unknown=unknown,
        ops=_shares(ops, timing.ms_per_step),
        note=_timed_settings.not_as_asked(setting, profile, xla),
        peak_mb=figures.peak_mb.get(name),
    )
