"""The commands' reports: typed records, built once; `to_dict()` is their JSON.

`tfdet._commands._check` builds a `CheckReport` from the runs; `tfdet check
--json` writes `CheckReport.to_dict()`, the human report is formatted from
the same typed report (`tfdet._cli._check_text`), and `tfdet.check()`
returns the `CheckReport` itself. `check --script` builds a `ScriptCheckReport`, `tfdet
locate` a `LocateReport` (or, with `--record`, a `RecordReport`). Nothing
else writes a report's JSON, so the Python object and the JSON file cannot
disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_RUN_FAILED
from tfdet._protocol import _perturb
from tfdet._record._diff import Divergence
from tfdet._record._layer_walk import Location
from tfdet._version import __version__
from tfdet.patches import pool_size_free_products

if TYPE_CHECKING:
    from tfdet._runner._spawn import RunOutcome

# The opt-in patch that makes each sample's predictions follow no batch.
_BATCH_FREE_PATCH = pool_size_free_products.PATCH.name

# Verdict of each exit code: the one mapping for devices and the whole check.
VERDICTS = {EXIT_OK: "identical", EXIT_DIVERGED: "diverged", EXIT_RUN_FAILED: "failed"}


@dataclasses.dataclass(frozen=True)
class Control:
    """What the same check without tfdet found (`control=True`).

    Attributes:
        verdict: `"identical"`, `"diverged"` or `"failed"`.
        exit_code: 0, 1 or 3.
        divergence: Its first divergence in one sentence, or None.
    """

    verdict: str
    exit_code: int
    divergence: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def control_of(plain: CheckReport | ScriptCheckReport) -> Control:
    """What a check without tfdet found, for the report of the check with it."""
    divergence = plain.divergence
    return Control(
        verdict=plain.verdict,
        exit_code=plain.exit_code,
        divergence=None if divergence is None else divergence.description,
    )


def control_line(
    control: Control | None,
    verdict: str,
    perturbations: Iterable[str] = (),
    patches: Iterable[str] = (),
) -> str | None:
    """The report's sentence on its control: what the verdict proves.

    Args:
        control: `control_of` the check without tfdet, or None (no control).
        verdict: The check with tfdet's (`"identical"`, `"diverged"`,
            `"failed"`).
        perturbations: The names of the perturbations both checks applied.
        patches: The check's `tfdet.enable(patches=...)`.
    """
    if control is None:
        return None
    if control.verdict == "diverged":
        said = {
            "identical": "so tfdet is what made these runs identical",
            "diverged": "as these runs do with tfdet",
        }.get(
            verdict,
            "but these runs with tfdet failed, so whether tfdet keeps them "
            "identical is not known",
        )
        return (
            f"control without tfdet: diverged ({control.divergence}): these "
            f"perturbations separate plain TensorFlow, {said}"
        )
    if control.verdict != "identical":
        return "control without tfdet: a run failed, so nothing was compared"
    if verdict == "identical":
        return (
            "control without tfdet: identical too: these perturbations do not "
            "separate plain TensorFlow on this model, so an identical verdict "
            "proves little here"
        )
    if verdict != "diverged":
        return (
            "control without tfdet: identical: these perturbations do not "
            "separate plain TensorFlow on this model; these runs with tfdet "
            "failed, so nothing was compared with it"
        )
    line = (
        "control without tfdet: identical, where these runs with tfdet "
        "diverged: the kernels that tfdet's settings choose (its oneDNN ISA "
        "cap, AVX2 by default where plain TensorFlow uses this CPU's best "
        "instructions, among them) follow these perturbations on this model, "
        "and plain TensorFlow's do not"
    )
    if _perturb.BATCH in perturbations and _BATCH_FREE_PATCH not in patches:
        line += (
            f"; for {_perturb.BATCH}: under tfdet a prediction's bits follow "
            "its batch here, and the opt-in patch "
            f"{_BATCH_FREE_PATCH} (`patches=auto,{_BATCH_FREE_PATCH}`) gives "
            "batch-invariant predictions"
        )
    return line


def _headline(subject: str, exit_code: int, shape: str, enable: bool) -> str:
    """A report's first line: what was checked, the verdict, how."""
    mode = "with" if enable else "without"
    return (
        f"tfdet check {subject}: {VERDICTS[exit_code].upper()} (exit {exit_code}); "
        f"{shape}, {mode} tfdet.enable()"
    )


def _pretty(report: Any, printer: Any, cycle: bool) -> None:
    """IPython and Jupyter show a report's `str`, not every field."""
    printer.text(f"{type(report).__name__}(...)" if cycle else str(report))


def combined_exit_code(codes: list[int]) -> int:
    """One exit code for several devices: a failure outranks a divergence."""
    return EXIT_RUN_FAILED if EXIT_RUN_FAILED in codes else max(codes, default=EXIT_OK)


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
    """

    profile: dict[str, Any]
    steps_recorded: int
    final_loss: str | None
    nonfinite: tuple[str, ...]
    trace: str
    entry_points: Any = None
    xla: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["nonfinite"] = list(self.nonfinite)
        return out


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """What a report says of every run (or worker process), trained or not.

    Attributes:
        index: The run's number on its device (0 is the baseline).
        worker: The worker's task index in a multi-worker run, or None.
        name: `run N` or `run N worker K`.
        perturbations: `{name: what it changed}`, and `{name: "not applied:
            why"}` for those the run could not apply.
        ok: Whether it finished and wrote its result.
        reason: Why it failed, in a few words (None when ok).
        returncode: Its exit status (None when it timed out).
        timed_out: Whether it was killed for exceeding the timeout.
        seconds: Wall time from start to exit.
    """

    index: int
    worker: int | None
    name: str
    perturbations: dict[str, str]
    ok: bool
    reason: str | None
    returncode: int | None
    timed_out: bool
    seconds: float

    @classmethod
    def of(cls, outcome: RunOutcome) -> ProcessFacts:
        setup = outcome.setup
        return cls(
            index=setup.index,
            worker=setup.worker,
            name=setup.name,
            perturbations={**setup.labels, **outcome.not_applied},
            ok=outcome.ok,
            reason=outcome.reason,
            returncode=outcome.returncode,
            timed_out=outcome.timed_out,
            seconds=round(outcome.seconds, 3),
        )


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
        return _process_dict(self.facts, self.training, self.stderr_tail)


def _process_dict(
    facts: ProcessFacts,
    trained: Training | ScriptTraining | None,
    stderr_tail: str | None,
) -> dict[str, Any]:
    """One process's `--json` entry, for a check's run and a script's: what
    is said of every run, then what a finished one trained, then the end of
    a failed one's stderr."""
    out = dataclasses.asdict(facts)
    if trained is not None:
        out.update(trained.to_dict())
    if stderr_tail is not None:
        out["stderr_tail"] = stderr_tail
    return out


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
        threads: The runs' `tfdet.enable(threads=...)`.
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
    threads: int
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
            _headline(
                self.target,
                self.exit_code,
                f"{self.runs_per_device} runs x {self.steps} steps",
                self.enable,
            )
        ]
        for device, result in self.devices.items():
            if result.status == "skipped":
                lines.append(f"  {device}: skipped, {result.reason}")
            else:
                lines.append(f"  {device}: {VERDICTS[result.exit_code]}")
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

    _repr_pretty_ = _pretty

    @property
    def runs(self) -> tuple[RunFacts, ...]:
        """Every run's facts, device by device."""
        return tuple(
            RunFacts(
                device=device,
                index=run.facts.index,
                ok=run.ok,
                perturbations=dict(run.facts.perturbations),
                final_loss=_float(run.training and run.training.final_loss),
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


def _float(value: Any) -> float | None:
    # The JSON report keeps the loss as its exact decimal text.
    return None if value is None else float(value)


@dataclasses.dataclass(frozen=True)
class ScriptTraining:
    """What a finished run of `tfdet check --script` trained and recorded.

    Attributes:
        end: How the script ended (`"completed"`, `"raised"`, ...).
        entry_points: How it trained (`fit`, `train_on_batch`, a custom loop).
        keras: Which Keras its trainings used (`"Keras 3"`, `"tf_keras"`).
        steps_recorded: Steps recorded over all its trainings.
        trainings: One entry per training (`name`, `steps`, its trace file,
            and `updates` for a loop whose steps run in a tf.function).
        xla: Whether XLA compiled its steps (`on`), and the notice of a
            `jit_compile=True` that Keras dropped (`notice`, or None).
        own_copies: `{file outside the runs' directories: the run's own copy
            of it}` (training state a resume reads back).
        spawned: The processes the script started with multiprocessing's
            "spawn" or "forkserver" (enabled as the run was, or not at all
            without tfdet); their training is not recorded.
    """

    end: str
    entry_points: tuple[str, ...]
    keras: tuple[str, ...]
    steps_recorded: int
    trainings: tuple[dict[str, Any], ...]
    xla: dict[str, Any]
    own_copies: dict[str, str]
    spawned: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "end": self.end,
            "entry_points": list(self.entry_points),
            "keras": list(self.keras),
            "steps_recorded": self.steps_recorded,
            "trainings": list(self.trainings),
            "xla": self.xla,
            "own_copies": dict(self.own_copies),
            "spawned": self.spawned,
        }


@dataclasses.dataclass(frozen=True)
class ScriptRunReport:
    """One run of `tfdet check --script`.

    Attributes:
        facts: What is said of every run, trained or not.
        trained: What a finished run trained, or None for a run that failed.
        stderr_tail: The end of a failed run's stderr, or None.
    """

    facts: ProcessFacts
    trained: ScriptTraining | None = None
    stderr_tail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _process_dict(self.facts, self.trained, self.stderr_tail)


@dataclasses.dataclass(frozen=True)
class ScriptDivergence:
    """The first difference between two runs of `tfdet check --script`.

    Attributes:
        training: The training it is in (`"fit #1 (model sequential)"`), or
            None when the runs trained differently.
        found: What differs, as the JSON report spells it: a recorded step's
            `tfdet._record._diff.Divergence.to_dict()` (step, epoch,
            quantity, expected, received, ulps, detail); or `quantity`
            (`"trainings"`, `"final weights:VARIABLE"`) with run a's and run
            b's values `a` and `b`; or nothing, when only one run recorded
            steps.
        description: The same in one sentence.
        runs: The two runs' indices.
        attribution: Which perturbation separates the runs, or None when
            not attributed.
    """

    training: str | None
    found: dict[str, Any]
    description: str
    runs: tuple[int, int]
    attribution: Attribution | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "training": self.training,
            **self.found,
            "description": self.description,
            "runs": list(self.runs),
        }
        if self.attribution is not None:
            out["attribution"] = self.attribution.to_dict()
        return out


@dataclasses.dataclass(frozen=True)
class ScriptCheckReport:
    """What `tfdet check --script` found; `to_dict()` is its `--json` report.

    Attributes:
        script: The script checked.
        args: Its arguments.
        enable: Whether `tfdet run` called `tfdet.enable()` before it.
        seed: The runs' seed.
        threads: The runs' pool size.
        runs_per_check: Runs (`"runs"` in the JSON).
        max_steps: Where the runs stopped the script, or None.
        perturbations: The perturbations asked for.
        perturbations_skipped: `{perturbation: why it was not applied}`.
        run_reports: Every run's report.
        divergence: The first difference between two runs, or None.
        nothing_trained: Whether the runs finished without training a step.
        shared_writes: Files outside the runs' own directories that they
            changed (their bits were not compared in isolation).
        isolation: How the runs were kept from the user's files: an overlay
            each, or a copy each and why (`tfdet._runner._isolation`).
        notices: Keras's notices (a dropped `jit_compile=True`), once each.
        exit_code: 0, 1 or 3.
        control: With `control=True`, what the same runs without tfdet
            found; else None.
    """

    script: str
    args: tuple[str, ...]
    enable: bool
    seed: int
    threads: int
    runs_per_check: int
    max_steps: int | None
    perturbations: tuple[str, ...]
    perturbations_skipped: dict[str, str]
    run_reports: tuple[ScriptRunReport, ...]
    divergence: ScriptDivergence | None
    nothing_trained: bool
    shared_writes: tuple[str, ...]
    notices: tuple[str, ...]
    exit_code: int
    control: Control | None = None
    isolation: str = ""

    @property
    def verdict(self) -> str:
        """`"identical"`, `"diverged"` or `"failed"`."""
        return VERDICTS[self.exit_code]

    def __str__(self) -> str:
        """The verdict first, then the first divergence and Keras's notices.

        What `print(report)` and a notebook show; the full report is
        `to_dict()` (as `tfdet check --script ... --json` writes it).
        """
        lines = [
            _headline(
                f"--script {self.script}",
                self.exit_code,
                f"{self.runs_per_check} runs",
                self.enable,
            )
        ]
        if self.divergence is not None:
            lines.append(f"  first divergence: {self.divergence.description}")
        if self.nothing_trained:
            lines.append("  the runs trained nothing")
        lines.extend(f"  {notice}" for notice in self.notices)
        if self.control is not None:
            control = control_line(self.control, self.verdict, self.perturbations)
            lines.append(f"  {control}")
        return "\n".join(lines)

    _repr_pretty_ = _pretty

    def to_dict(self) -> dict[str, Any]:
        """The full report, as `tfdet check --script ... --json FILE` writes it."""
        return {
            "script": self.script,
            "args": list(self.args),
            "enable": self.enable,
            "seed": self.seed,
            "threads": self.threads,
            "runs": self.runs_per_check,
            "max_steps": self.max_steps,
            "perturbations": list(self.perturbations),
            "perturbations_skipped": dict(self.perturbations_skipped),
            "run_reports": [run.to_dict() for run in self.run_reports],
            "divergence": None
            if self.divergence is None
            else self.divergence.to_dict(),
            "nothing_trained": self.nothing_trained,
            "shared_writes": list(self.shared_writes),
            "isolation": self.isolation,
            "notices": list(self.notices),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "control": None if self.control is None else self.control.to_dict(),
            "tfdet_version": __version__,
        }


@dataclasses.dataclass(frozen=True)
class LocateRun:
    """One of `tfdet locate`'s two runs.

    Attributes:
        index: 0 or 1.
        perturbations: `{name: what it changed}` for this run.
        profile: The profile the run recorded (`tfdet.Profile.to_dict()`).
        seconds: How long the run took.
    """

    index: int
    perturbations: dict[str, str]
    profile: dict[str, Any]
    seconds: float


# What `tfdet locate`'s report says of each layer of the model.
LAYER_FIELDS = ("name", "class", "scope", "ops", "gradient_ops")


@dataclasses.dataclass(frozen=True)
class LocateReport:
    """What `tfdet locate` found; `to_dict()` is `tfdet locate --json`.

    Attributes:
        target: The TARGET located.
        enable: Whether the runs called `tfdet.enable()`.
        steps: Training steps per run.
        perturbations: The perturbations asked for.
        perturbations_skipped: `{name: why}` for those that did not apply.
        runs: The two runs.
        layers: Each layer's `LAYER_FIELDS`, in the order walked.
        location: Where the runs' bits first part, or None when every
            fingerprint agrees.
        exit_code: 0 (identical) or 1 (diverged).
    """

    target: str
    enable: bool
    steps: int
    perturbations: tuple[str, ...]
    perturbations_skipped: dict[str, str]
    runs: tuple[LocateRun, ...]
    layers: tuple[dict[str, Any], ...]
    location: Location | None
    exit_code: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "enable": self.enable,
            "steps": self.steps,
            "perturbations": list(self.perturbations),
            "perturbations_skipped": dict(self.perturbations_skipped),
            "runs": [dataclasses.asdict(run) for run in self.runs],
            "layers": [dict(layer) for layer in self.layers],
            "location": None if self.location is None else self.location.to_dict(),
            "exit_code": self.exit_code,
        }


@dataclasses.dataclass(frozen=True)
class RecordReport:
    """What `tfdet locate --record` wrote; `to_dict()` is its `--json`.

    Attributes:
        target: The TARGET recorded.
        enable: Whether the run called `tfdet.enable()`.
        steps: Training steps recorded.
        record: The record's path.
        emulated: The emulated CPU the run saw, or None (a native run).
        profile: The profile the run recorded.
        layers: The layers' names, in the order walked.
        seconds: How long the run took.
        exit_code: 0.
    """

    target: str
    enable: bool
    steps: int
    record: str
    emulated: str | None
    profile: dict[str, Any]
    layers: tuple[str, ...]
    seconds: float
    exit_code: int = EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["layers"] = list(self.layers)
        return out
