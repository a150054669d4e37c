"""`tfdet check`'s report: `CheckReport`, built once from the runs.

`tfdet._commands._check` builds it; `tfdet check --json` writes
`CheckReport.to_dict()`, the human report is formatted from the same typed
report (`tfdet._cli._check_text`), and `tfdet.check()` returns it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._commands._report_common import (
    VERDICTS,
    Control,
    ProcessFacts,
    control_line,
    float_or_none,
    headline,
    pretty,
    process_dict,
)
from tfdet._record._diff import Divergence
from tfdet._version import __version__


@dataclasses.dataclass(frozen=True)
class Training:
    """What a finished run trained and recorded.

    Attributes:
        profile: The determinism profile the run observed (`Profile.to_dict`).
        steps_recorded: Steps in its trace.
        final_loss: The last step's loss as its exact decimal text, or None.
        nonfinite: Where NaN or Inf appeared (`"loss nan from step 1"`).
        trace: Its trace file (the kept copy, with `traces=`).
        entry_points: How it trained (`train_on_batch`, `fit`).
        xla: Whether XLA compiled its step, and the notice of a
            `jit_compile=True` that Keras dropped.
        coverage: What it traced that its profile does not cover
            (`tfdet._setup._coverage.Coverage.to_dict`), or None.
    """

    profile: dict[str, Any]
    steps_recorded: int
    final_loss: str | None
    nonfinite: tuple[str, ...]
    trace: str
    entry_points: Any = None
    xla: dict[str, Any] | None = None
    coverage: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["nonfinite"] = list(self.nonfinite)
        return out


@dataclasses.dataclass(frozen=True)
class RunReport:
    """One process of a check.

    Attributes:
        facts: What is said of every run, trained or not.
        training: What it trained (a run that finished), or None.
        stderr_tail: The end of its stderr without TensorFlow's start-up
            notices (a run that failed), or None.
    """

    facts: ProcessFacts
    training: Training | None = None
    stderr_tail: str | None = None

    @property
    def ok(self) -> bool:
        return self.facts.ok

    def to_dict(self) -> dict[str, Any]:
        return process_dict(self.facts, self.training, self.stderr_tail)


def attribution_verdict(alone: dict[str, str], rerun: str, subject: str) -> str:
    """One sentence from what each re-run alone did (`Attribution.alone`):
    which perturbation separates the runs, or that `subject` (the target,
    the script) is nondeterministic by itself (the `rerun` of the
    baseline's own settings differs)."""
    if alone.get(rerun) == "differs":
        return (
            f"the {subject} is nondeterministic by itself: a re-run with the "
            "baseline's exact settings also differs"
        )
    responsible = responsible_of(alone, rerun)
    if responsible:
        return "separated by " + ", ".join(responsible)
    return "no single perturbation reproduces it alone (a combination, or flaky)"


def responsible_of(alone: dict[str, str], rerun: str) -> list[str]:
    """The perturbations whose re-run alone differs from the baseline."""
    return [name for name, said in alone.items() if name != rerun and said == "differs"]


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Which perturbation, alone, reproduces a divergence.

    Attributes:
        alone: `{perturbation, or the re-run with none: "differs" / "same
            bits" / "run failed (...)"}`.
        responsible: The perturbations that differ alone.
        verdict: One sentence: which perturbation separates the runs, or
            that the target (the script) is nondeterministic by itself.
        steps_rerun: How many steps each re-run trained (a TARGET's check);
            None for a script's, whose re-runs train what the script does.
        pool_size_ops: A TARGET's check, when `threads` is responsible: the
            op types the runs traced whose CPU bits follow the thread-pool
            size (from tfdet's op table), else empty; None for a script's.
    """

    alone: dict[str, str]
    responsible: tuple[str, ...]
    verdict: str
    steps_rerun: int | None = None
    pool_size_ops: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "alone": dict(self.alone),
            "responsible": list(self.responsible),
            "verdict": self.verdict,
        }
        if self.steps_rerun is not None:
            out["steps_rerun"] = self.steps_rerun
        if self.pool_size_ops is not None:
            out["pool_size_ops"] = list(self.pool_size_ops)
        return out


@dataclasses.dataclass(frozen=True)
class DivergenceReport:
    """The first difference between two runs (or two workers of one run).

    `step`, `epoch`, `quantity`, `expected`, `received`, `ulps` and
    `detail` read those of `found`.

    Attributes:
        device: `"cpu"` or `"gpu"`: where the runs trained.
        runs: The two runs' indices.
        worker: In a multi-worker check, the worker whose bits parted; None
            for runs of one process.
        found: What differs first, and both values.
        description: The same in one sentence.
        profile_differences: `{profile field: [run a's, run b's]}`.
        workers: Two workers of ONE run that disagree, or None.
        attribution: Which perturbation separates the runs, or None.
    """

    device: str
    runs: tuple[int, int]
    worker: int | None
    found: Divergence
    description: str
    profile_differences: dict[str, list[Any]]
    workers: tuple[int, int] | None = None
    attribution: Attribution | None = None

    @property
    def step(self) -> int:
        return self.found.step

    @property
    def epoch(self) -> int | None:
        return self.found.epoch

    @property
    def quantity(self) -> str:
        return self.found.quantity

    @property
    def expected(self) -> str:
        return self.found.expected

    @property
    def received(self) -> str:
        return self.found.received

    @property
    def ulps(self) -> int | None:
        return self.found.ulps

    @property
    def detail(self) -> dict[str, Any] | None:
        return self.found.detail

    def run_names(self) -> tuple[str, str]:
        """The two runs as the report names them: `1`, or `1 worker 0`."""
        a, b = (str(index) for index in self.runs)
        if self.workers is not None:  # Two workers of one run disagree.
            return f"{a} worker {self.workers[0]}", f"{b} worker {self.workers[1]}"
        if self.worker is not None:
            return f"{a} worker {self.worker}", f"{b} worker {self.worker}"
        return a, b

    def to_dict(self) -> dict[str, Any]:
        """The device's `divergence` in `tfdet check --json` (its device is
        the key it is under)."""
        out: dict[str, Any] = {
            "runs": list(self.runs),
            "worker": self.worker,
            **self.found.to_dict(),
            "description": self.description,
            "profile_differences": {
                name: list(values) for name, values in self.profile_differences.items()
            },
        }
        if self.attribution is not None:
            out["attribution"] = self.attribution.to_dict()
        if self.workers is not None:
            out["workers"] = list(self.workers)
        return out


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    """The check on one device: its runs and verdict, or why it was skipped.

    Attributes:
        status: `"ran"` or `"skipped"`.
        reason: Why it was skipped (a skipped device), or None.
        runs: Every process's report (a run of N workers has N).
        steps: Steps each run trained.
        workers: Worker processes per run.
        replicas: Replicas per process.
        perturbations: The perturbations asked for.
        perturbations_skipped: `{perturbation: why it was not applied here}`.
        divergence: The first divergence, or None.
        exit_code: 0, 1 or 3 (None for a skipped device).
    """

    status: str
    reason: str | None = None
    runs: tuple[RunReport, ...] = ()
    steps: int = 0
    workers: int = 1
    replicas: int = 1
    perturbations: tuple[str, ...] = ()
    perturbations_skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    divergence: DivergenceReport | None = None
    exit_code: int | None = None

    @classmethod
    def skipped(cls, reason: str) -> DeviceReport:
        return cls(status="skipped", reason=reason)

    @property
    def ran(self) -> bool:
        return self.status == "ran"

    @property
    def verdict(self) -> str | None:
        return None if self.exit_code is None else VERDICTS[self.exit_code]

    def to_dict(self) -> dict[str, Any]:
        if not self.ran:
            return {"status": self.status, "reason": self.reason}
        return {
            "status": self.status,
            "runs": [run.to_dict() for run in self.runs],
            "steps": self.steps,
            "workers": self.workers,
            "replicas": self.replicas,
            "perturbations": list(self.perturbations),
            "perturbations_skipped": dict(self.perturbations_skipped),
            "divergence": None
            if self.divergence is None
            else self.divergence.to_dict(),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
        }


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """One run of a check.

    Attributes:
        device: `"cpu"` or `"gpu"`.
        index: The run's number on its device (0 is the baseline).
        ok: Whether it finished and wrote its result.
        perturbations: `{name: what it changed}` for this run.
        final_loss: The last step's loss (a float), or None.
        seconds: How long the run took.
        reason: Why it failed (None when ok).
        trace: The kept trace file (with `traces=`), or None.
        worker: The worker's task index in a multi-worker run (`workers=N`),
            or None.
    """

    device: str
    index: int
    ok: bool
    perturbations: dict[str, str]
    final_loss: float | None
    seconds: float
    reason: str | None
    trace: str | None
    worker: int | None = None


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """What `tfdet.check()` found; `to_dict()` is `tfdet check --json`'s report.

    Attributes:
        target: The TARGET checked (a function passed by value: its
            `module:name`).
        enable: Whether the runs called `tfdet.enable()`.
        seed: The runs' seed.
        threads: The runs' `tfdet.enable(threads=...)`; None (the default)
            is the CPUs each run may use.
        patches: The runs' `tfdet.enable(patches=...)`.
        runs_per_device: Runs on each device (`runs=`; `"runs"` in the JSON).
        steps: Steps each run trained.
        workers: Worker processes per run.
        replicas: Replicas per process.
        traces: The directory where the traces were kept, or None.
        devices: `{"cpu" / "gpu": DeviceReport}`.
        imitated: `{perturbation: the difference between machines it stands for}`.
        varied: `{perturbation: what it changed}` for those that ran and are
            not another machine (`threads`, `interrupt`), or empty.
        not_imitated: `{difference: why one machine cannot imitate it}`.
        emulated: `{perturbation: the emulated CPU a run ran on, and what that
            stands for}` (`emulated_cpu`), or empty.
        exit_code: `tfdet check`'s exit code: 0, 1 or 3.
        control: With `control=True`, what the same runs without tfdet
            found; else None.
    """

    target: str
    enable: bool
    seed: int
    threads: int | None
    patches: tuple[str, ...]
    runs_per_device: int
    steps: int
    workers: int
    replicas: int
    traces: str | None
    devices: dict[str, DeviceReport]
    imitated: dict[str, str]
    varied: dict[str, str]
    not_imitated: dict[str, str]
    emulated: dict[str, str]
    exit_code: int
    control: Control | None = None

    @property
    def verdict(self) -> str:
        """`"identical"`, `"diverged"` or `"failed"`."""
        return VERDICTS[self.exit_code]

    def __str__(self) -> str:
        """The verdict first, then each device's, then the first divergence.

        What `print(tfdet.check(...))` and a notebook show; the full report
        is `to_dict()` (as `tfdet check --json` writes it).
        """
        lines = [
            headline(
                self.target,
                self.exit_code,
                f"{self.runs_per_device} runs x {self.steps} steps",
                self.enable,
            )
        ]
        for device, result in self.devices.items():
            if result.verdict is None:
                lines.append(f"  {device}: skipped, {result.reason}")
            else:
                lines.append(f"  {device}: {result.verdict}")
        divergence = self.divergence
        if divergence is not None:
            lines.append(f"  first divergence: {divergence.description}")
        if self.imitated:
            lines.append(f"  imitated other machines by: {', '.join(self.imitated)}")
        if self.control is not None:
            control = control_line(
                self.control,
                self.verdict,
                [*self.imitated, *self.varied],
                self.patches,
            )
            lines.append(f"  {control}")
        return "\n".join(lines)

    _repr_pretty_ = pretty

    @property
    def runs(self) -> tuple[RunFacts, ...]:
        """Every run's facts, device by device."""
        return tuple(
            RunFacts(
                device=device,
                index=run.facts.index,
                ok=run.ok,
                perturbations=dict(run.facts.perturbations),
                final_loss=float_or_none(run.training and run.training.final_loss),
                seconds=run.facts.seconds,
                reason=run.facts.reason,
                trace=run.training.trace if run.training and self.traces else None,
                worker=run.facts.worker,
            )
            for device, result in self.devices.items()
            for run in result.runs
        )

    @property
    def divergence(self) -> DivergenceReport | None:
        """The first divergence (its `device`, `runs`, `step`, `quantity`,
        `expected`, `received`, `description`, and with attribution the
        perturbation responsible), or None."""
        return next(
            (d.divergence for d in self.devices.values() if d.divergence is not None),
            None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The full report, as `tfdet check --json FILE` writes it."""
        return {
            "target": self.target,
            "enable": self.enable,
            "seed": self.seed,
            "threads": self.threads,
            "patches": list(self.patches),
            "runs": self.runs_per_device,
            "steps": self.steps,
            "workers": self.workers,
            "replicas": self.replicas,
            "traces": self.traces,
            "devices": {name: d.to_dict() for name, d in self.devices.items()},
            "imitated": dict(self.imitated),
            "varied": dict(self.varied),
            "emulated": dict(self.emulated),
            "not_imitated": dict(self.not_imitated),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "control": None if self.control is None else self.control.to_dict(),
            "tfdet_version": __version__,
        }
