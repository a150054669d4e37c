"""`tfdet locate`'s reports: `LocateReport`, or `RecordReport` with `--record`."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._errors import EXIT_OK
from tfdet._record._layer_walk import Location


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
