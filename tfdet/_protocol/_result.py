"""What a child answers when it finishes: its result file, typed.

Each child writes one JSON object when it is done
(`tfdet._child._start.write_result`): what every kind writes (the
perturbations it applied, or could not, and the ops it ran whose bits follow
the pool size) and what its kind adds. The runner reads it once (`read`)
into the record of the child's kind, so that what follows reads attributes
a type checker knows, and a result that lacks a field its reader needs is
a run that failed and says which (never a KeyError deep in a report).

The records hold what the parent reads; a child may write more (its
environment, its arguments), for a person reading the file.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from tfdet._protocol import _spec


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What every child writes (and all a preflight child writes).

    Attributes:
        perturbations_applied: `{perturbation: what it did}` for those the
            child applied itself.
        perturbations_not_applied: `{perturbation: why not}` for those it
            could not apply (a script that wrote no backup is never
            interrupted).
        pool_size_ops: The op types it ran whose CPU bits follow the
            thread-pool size (tfdet's op table).
        coverage: What it traced that its profile does not cover, and the
            tiers that takes (`tfdet._setup._coverage.Coverage.to_dict`);
            empty without `enable()`.
    """

    perturbations_applied: dict[str, str] = dataclasses.field(default_factory=dict)
    perturbations_not_applied: dict[str, str] = dataclasses.field(default_factory=dict)
    pool_size_ops: tuple[str, ...] = ()
    coverage: dict[str, Any] = dataclasses.field(default_factory=dict)

    # The fields its readers need: a result without one is unreadable.
    REQUIRED: ClassVar[tuple[str, ...]] = ()


@dataclasses.dataclass(frozen=True)
class CheckResult(WorkerResult):
    """A `tfdet check` run's process (`tfdet._child._worker`).

    Attributes:
        profile: The determinism profile it observed (`Profile.to_dict`).
        trace: Its trace file.
        variables: The model's variables' names, in `model.weights` order.
        final_weights: `{variable: exact digest of its final value}`.
        weights_file: The `.npz` of the final values, in `variables` order.
        entry_points: How it trained (`train_on_batch`, `fit`).
        xla: Whether XLA compiled its step (`on`), and the notice of a
            `jit_compile=True` that Keras dropped (`notice`).
        predictions: Under the `batch` perturbation, a digest per sample
            predicted, in the inputs' order; else None.
        prediction_batches: With `predictions`, `[batch size, place in it]`
            per sample.
    """

    profile: dict[str, Any] = dataclasses.field(default_factory=dict)
    trace: str = ""
    variables: tuple[str, ...] = ()
    final_weights: dict[str, str] = dataclasses.field(default_factory=dict)
    weights_file: str = ""
    entry_points: tuple[str, ...] = ()
    xla: dict[str, Any] = dataclasses.field(default_factory=dict)
    predictions: tuple[str, ...] | None = None
    prediction_batches: tuple[tuple[int, int], ...] | None = None

    # Written by every check process; the others may be absent.
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "profile",
        "trace",
        "variables",
        "final_weights",
        "weights_file",
    )


@dataclasses.dataclass(frozen=True)
class ScriptResult(WorkerResult):
    """A `tfdet check --script` run's process (`tfdet._child._script_worker`).

    Attributes:
        profile: The profile it observed, or None (a run without tfdet).
        end: How the script ended (`"completed"`, `"raised"`, ...).
        traces: One entry per training: `name`, its `trace` file (or None),
            `steps`, and `updates` for a loop whose steps run in a
            tf.function.
        entry_points: How it trained (`fit`, `train_on_batch`, a loop).
        keras: Which Keras its trainings used (`"Keras 3"`, `"tf_keras"`).
        steps_recorded: Steps recorded over all its trainings.
        final_weights: `{training: {variable: exact digest}}`.
        xla: Whether XLA compiled its steps (`on`), and Keras's notice.
        own_copies: `{file outside the run's directory: the run's copy}`.
        spawned: The processes the script started with multiprocessing's
            "spawn" or "forkserver" (enabled as the run was; what they
            trained is not recorded).
    """

    profile: dict[str, Any] | None = None
    end: str = ""
    traces: tuple[dict[str, Any], ...] = ()
    entry_points: tuple[str, ...] = ()
    keras: tuple[str, ...] = ()
    steps_recorded: int = 0
    final_weights: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    xla: dict[str, Any] = dataclasses.field(default_factory=dict)
    own_copies: dict[str, str] = dataclasses.field(default_factory=dict)
    spawned: int = 0

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "end",
        "traces",
        "entry_points",
        "keras",
        "final_weights",
        "xla",
    )


@dataclasses.dataclass(frozen=True)
class LocateResult(WorkerResult):
    """A `tfdet locate` run's process (`tfdet._child._locate_worker`).

    Attributes:
        profile: The profile it observed.
        layers: Each layer's record (`name`, `class`, `scope`, `tensors`,
            `ops`, `gradient_ops`, `consumers`, `model_output`), in the
            order walked.
        variables: The model's variables' names.
        variable_layers: For each variable, the index of its layer in
            `layers`, or None.
        steps: Per step, each layer's fingerprints.
    """

    profile: dict[str, Any] = dataclasses.field(default_factory=dict)
    layers: tuple[dict[str, Any], ...] = ()
    variables: tuple[str, ...] = ()
    variable_layers: tuple[int | None, ...] = ()
    steps: tuple[dict[str, Any], ...] = ()

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "profile",
        "layers",
        "variables",
        "variable_layers",
        "steps",
    )


@dataclasses.dataclass(frozen=True)
class CostResult(WorkerResult):
    """A `tfdet cost` run's process (`tfdet._child._cost_worker`).

    Attributes:
        steps: The steps it trained.
        own_copies: A script's `{file outside the run's directory: the
            run's copy}` (a TARGET's run has none).
    """

    steps: int = 0
    own_copies: dict[str, str] = dataclasses.field(default_factory=dict)

    REQUIRED: ClassVar[tuple[str, ...]] = ("steps",)


# The record each kind of child answers with.
_RECORDS: dict[str, type[WorkerResult]] = {
    _spec.CHECK: CheckResult,
    _spec.SCRIPT: ScriptResult,
    _spec.LOCATE: LocateResult,
    _spec.COST: CostResult,
    _spec.PREFLIGHT: WorkerResult,
}


def read(kind: str, data: Any) -> WorkerResult:
    """The record of a `kind` child's result, from the JSON it wrote.

    Raises:
        ValueError: `data` is not an object, or lacks a field its kind's
            readers need (named).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
    record = _RECORDS[kind]
    missing = [name for name in record.REQUIRED if name not in data]
    if missing:
        raise ValueError(f"it lacks {', '.join(missing)}")
    values = {
        name: _typed(data[name], hint)
        for name, hint in _field_hints(record).items()
        if data.get(name) is not None
    }
    return record(**values)


# `{record type's name: {field: its type}}`, resolved once per record type.
_FIELD_HINTS: dict[str, dict[str, Any]] = {}


def _field_hints(record: type[WorkerResult]) -> dict[str, Any]:
    """`{field: its type}` of a record."""
    if record.__name__ not in _FIELD_HINTS:
        hints = typing.get_type_hints(record)
        _FIELD_HINTS[record.__name__] = {
            field.name: hints[field.name] for field in dataclasses.fields(record)
        }
    return _FIELD_HINTS[record.__name__]


def _typed(value: Any, hint: Any) -> Any:
    """JSON's lists as the tuples a record holds (frozen, hashable)."""
    if isinstance(value, list) and _allows_tuple(hint):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def _allows_tuple(hint: Any) -> bool:
    """Whether `hint` is `tuple[...]`, or `tuple[...] | None`."""
    return typing.get_origin(hint) is tuple or any(
        typing.get_origin(arg) is tuple for arg in typing.get_args(hint)
    )
