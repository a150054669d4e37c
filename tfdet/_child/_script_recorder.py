"""What a script's run records: one trace per training, the steps, the final digests.

A training is a `fit` call, a model's `train_on_batch` calls, or an
optimizer's custom loop (`RecordedTraining`, of the kinds below); the
`Recorder` is the state the hooks (`_script_hooks`) share: the trainings
in the order they began, the entry points exercised, the models trained,
the step count and `--max-steps`, which ends the script
(`MaxStepsReached`). At the end, `final_digests` takes the exact digest of
every variable trained.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from tfdet._child import _start
from tfdet._protocol import _spec

FIT = "fit"
TRAIN_ON_BATCH = "train_on_batch"
CUSTOM = "custom loop (optimizer)"
CUSTOM_COMPILED = "custom loop (optimizer in a tf.function: final weights only)"

# A callable returning a training's variables (TensorFlow's, untyped).
Variables = Callable[[], Iterable[Any]]


class MaxStepsReached(BaseException):
    """Raised from a hook at --max-steps; a BaseException, so that a script's
    own `except Exception` does not swallow it."""


class RecordedTraining:
    """One recorded training: a fit call, a model's train_on_batch, a loop."""

    def __init__(self, name: str, kind: str, path: str, variables: Variables) -> None:
        self.name = name
        self.kind = kind
        self.path = path
        self.variables = variables
        self.writer: Any = None  # A `_trace.TraceWriter`, from the first step.
        self.steps = 0
        # A fit's recording callback, which writes its trace itself.
        self.callback: Any = None
        # The model or optimizer the training is keyed by (kept alive).
        self.key: Any = None

    def record(self, logs: dict[str, Any]) -> None:
        from tfdet._pin import _environment
        from tfdet._record import _bits, _trace
        from tfdet._setup import _enable

        variables = list(self.variables())
        if self.writer is None:
            header = _trace.make_header(
                _enable.observed_profile(),
                _environment.fingerprint(_enable.profile()),
                _bits.variable_names(variables),
                every=1,
                variables_every=1,
                training=self.name,
            )
            if _spec.resumed_after() is None:
                self.writer = _trace.TraceWriter(self.path, header)
            else:
                # Resumed after the `interrupt` perturbation killed this run:
                # continue its trace, numbering steps by the restored
                # optimizer (the script's own checkpoint decides where).
                self.writer = _trace.continued(self.path, header)
                self.steps = optimizer_steps(self.key, self.steps)
        checksums = _bits.weight_checksums(variables)
        self.writer.write_step(_trace.step_record(self.steps, logs, checksums))
        self.steps += 1

    def steps_recorded(self) -> int:
        if self.callback is not None:
            return self.callback.steps_recorded_total
        return self.steps

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "trace": self.path if os.path.exists(self.path) else None,
            "steps": self.steps_recorded(),
        }
        if self.kind == CUSTOM_COMPILED:
            # Not recorded one by one, but counted by the optimizer.
            iterations: Any = getattr(self.key, "iterations", None)
            try:
                entry["updates"] = int(iterations.numpy())
            except (AttributeError, TypeError, ValueError):
                entry["updates"] = None
        return entry


class Recorder:
    """The hooks' shared state: traces, step count, --max-steps."""

    def __init__(self, base: str, max_steps: int | None) -> None:
        self.base = base
        self.max_steps = max_steps
        self.traces: list[RecordedTraining] = []
        self.entry_points: list[str] = []
        self.models: list[Any] = []
        self.total = 0
        self.depth = 0  # > 0 inside fit / train_on_batch: no optimizer records.
        self._by_key: dict[int, RecordedTraining] = {}

    def entry(self, name: str) -> None:
        if not self.entry_points:
            # The parent starts the CPU-burning neighbour of a run now.
            _start.report_stage(_spec.TRAINING)
        if name not in self.entry_points:
            self.entry_points.append(name)

    def new_trace(
        self, kind: str, label: str, variables: Variables
    ) -> RecordedTraining:
        """A new trace, named e.g. `fit #2 (model sequential)`."""
        index = len(self.traces)
        number = sum(t.kind == kind for t in self.traces) + 1
        trace = RecordedTraining(
            f"{kind.split(' (')[0]} #{number} ({label})",
            kind,
            f"{self.base}.{index}.jsonl",
            variables,
        )
        self.traces.append(trace)
        return trace

    def trace_for(
        self, key: Any, kind: str, label: str, variables: Variables
    ) -> RecordedTraining:
        trace = self._by_key.get(id(key))
        if trace is None:
            trace = self._by_key[id(key)] = self.new_trace(kind, label, variables)
            # Kept alive, so that its id() is never another object's.
            trace.key = key
        return trace

    def model_trained(self, model: Any) -> None:
        if all(m is not model for m in self.models):
            self.models.append(model)

    def step_done(self) -> None:
        self.total += 1
        _start.report_progress(self.total, self.max_steps or 0)
        if self.max_steps is not None and self.total >= self.max_steps:
            raise MaxStepsReached


def optimizer_steps(key: Any, default: int) -> int:
    """The index of the step just taken, by the optimizer's step count."""
    optimizer: Any = (
        key if hasattr(key, "iterations") else getattr(key, "optimizer", None)
    )
    try:
        return int(optimizer.iterations.numpy()) - 1
    except (AttributeError, TypeError, ValueError):
        return default


def final_digests(recorder: Recorder) -> dict[str, dict[str, str]]:
    """`{trace name: {variable: digest}}` for every training recorded."""
    import numpy as np

    from tfdet._record import _bits

    digests = {}
    for trace in recorder.traces:
        variables = list(trace.variables())
        digests[trace.name] = _bits.weights_digests(
            variables, [np.asarray(v) for v in variables]
        )
    return digests
