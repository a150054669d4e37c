"""`tfdet check --script`'s report: `ScriptCheckReport`, built once from the runs."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._commands._check_report import Attribution
from tfdet._commands._report_common import (
    VERDICTS,
    Control,
    ProcessFacts,
    control_line,
    headline,
    pretty,
    process_dict,
)
from tfdet._version import __version__


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
        return process_dict(self.facts, self.trained, self.stderr_tail)


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
        threads: The runs' pool size (None: the CPUs of each run).
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
    threads: int | None
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
            headline(
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

    _repr_pretty_ = pretty

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
