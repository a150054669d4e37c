"""`tfdet.DeterminismCallback`: record a step trace, compare it live.

Keras 3 and tf_keras each check the callbacks passed to `fit` against their
own `Callback` API (tf_keras calls `_implements_train_batch_hooks`, which
Keras 3's base class lacks). `tfdet.DeterminismCallback(...)` therefore
builds an instance of a subclass of both base classes whenever tf_keras is
in use (`TF_USE_LEGACY_KERAS=1`, or `tf_keras` imported), and of the Keras 3
class otherwise; either is an instance of `tfdet.DeterminismCallback`.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import keras

from tfdet._errors import ProfileMismatchError
from tfdet._pin import _versions
from tfdet._record import _batches, _bits, _diff, _trace

_LOG = logging.getLogger("tfdet")

_ACTIONS = ("stop", "raise", "warn")


def _check_trace_path(path: str) -> None:
    """Fails now, not at `fit()`, when the trace file cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    problem = None
    if os.path.isdir(path):
        problem = "it is a directory"
    elif not os.path.isdir(directory):
        # TraceWriter creates missing directories; their nearest existing
        # ancestor must then be writable.
        existing = directory
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            problem = f"{existing!r} is a file, not a directory"
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem = f"its directory cannot be created under {existing!r}"
    elif not os.access(directory, os.W_OK | os.X_OK):
        problem = f"its directory {directory!r} is not writable"
    elif os.path.exists(path) and not os.access(path, os.W_OK):
        problem = "the file exists and is not writable"
    if problem is not None:
        raise ValueError(
            f"Expected `trace` to be a path tfdet can write. Received: "
            f"trace={path!r} ({problem}). Pass a path in a writable directory."
        )


if TYPE_CHECKING:

    class _KerasCallback:
        """What the hooks use of Keras's `Callback` (Keras 3's and tf_keras's
        alike), which comes after them in `DeterminismCallback`: for the type
        checker only, as Keras ships no types."""

        model: Any

        def set_model(self, model: Any) -> None: ...

else:
    _KerasCallback = object


class _DeterminismHooks(_KerasCallback):
    """Records every training step's bits and compares them with a reference.

    Each recorded step holds the loss and metrics as exact bits and a
    fingerprint of all weights, computed on the device (8 bytes per variable
    leave it). With `trace`, the steps are written to a JSON Lines file,
    flushed line by line. With `reference`, each step is compared with the
    same step of a trace recorded earlier, as it happens; at the first
    difference the callback does what `on_divergence` says.

    A reference recorded under a different `tfdet.Profile` (other thread
    count, ISA, versions, ...) is reported first, as a warning that lists the
    differing fields, and the bits are compared anyway: the first diverging
    step is still worth knowing. The fields are also in
    `profile_differences`.

    Each `fit` call starts afresh: the trace file is rewritten and step 0 is
    the first step of that `fit`. At the end of every `fit`, the callback
    logs one summary line at WARNING level (logger `"tfdet"`, shown by absl
    and by Python's default logging): `"tfdet: 4 steps identical to reference
    run.jsonl"`, the divergence, how many steps were recorded, or a warning
    when the reference holds steps (up to this run's last) that were not
    compared, e.g. because of another `every`.

    In CI, use `on_divergence="raise"`: the default `"stop"` ends training
    early but `fit` returns normally, so a script that does not test
    `callback.stopped_on_divergence` (or `callback.divergence`) exits 0.

    Works with Keras 3 and tf_keras `fit`: when tf_keras is in use
    (`TF_USE_LEGACY_KERAS=1`, or `tf_keras` imported before the callback is
    made), the instance also subclasses `tf_keras.callbacks.Callback`.

    Example:

    >>> tfdet.enable(seed=1)                                      # doctest: +SKIP
    >>> model.fit(x, y, callbacks=[
    ...     tfdet.DeterminismCallback(trace="run.jsonl")])         # doctest: +SKIP
    >>> # Later, or on another machine:
    >>> model.fit(x, y, callbacks=[tfdet.DeterminismCallback(
    ...     reference="run.jsonl", on_divergence="raise")])        # doctest: +SKIP

    Args:
        trace: Path of the trace file to write, or None.
        reference: A trace to compare against (path or `tfdet` trace), or None.
        every: Record (and compare) every `every`-th step, from step 0.
        on_divergence: At the first difference from `reference`: `"stop"` logs
            the step, the quantity, both values and the ulp distance at
            WARNING, sets `model.stop_training` (fit returns normally, with
            the history of the steps it ran) and `stopped_on_divergence`;
            `"raise"` raises `tfdet.DivergenceError` with the same facts (use
            it in CI: the script fails); `"warn"` warns and trains on.
        variables_every: Also record one fingerprint per variable every
            `variables_every`-th recorded step (0: never). They let `tfdet
            diff` name the first differing variable.

    Attributes:
        divergence: The first difference found in the last `fit`, or None.
        stopped_on_divergence: Whether the last `fit` was stopped by this
            callback (`on_divergence="stop"`) at a divergence.
        profile_differences: `{field: (reference, this run)}` of the profiles.
        steps_recorded: Number of steps recorded in the last `fit`.

    Raises:
        ValueError: an argument is out of range, or `trace` cannot be written.
        TraceFormatError: `reference` is a path that is missing or is not a
            readable tfdet trace (read when the callback is made).
    """

    def __init__(
        self,
        trace: str | os.PathLike[str] | None = None,
        reference: str | os.PathLike[str] | _trace.Trace | None = None,
        every: int = 1,
        on_divergence: str = "stop",
        *,
        variables_every: int = 1,
    ) -> None:
        super().__init__()
        # tf_keras's CallbackList reads these; its own __init__ is not called
        # (it would assign `model`, a read-only property in Keras 3).
        self.validation_data = None
        self._chief_worker_only = None
        self._supports_tf_logs = False
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(
                f"Expected `every` to be an int >= 1. Received: every={every!r}"
            )
        if on_divergence not in _ACTIONS:
            raise ValueError(
                f"Expected `on_divergence` to be one of {_ACTIONS}. Received: "
                f"on_divergence={on_divergence!r}"
            )
        if (
            isinstance(variables_every, bool)
            or not isinstance(variables_every, int)
            or variables_every < 0
        ):
            raise ValueError(
                "Expected `variables_every` to be an int >= 0. Received: "
                f"variables_every={variables_every!r}"
            )
        self.trace = None if trace is None else os.fspath(trace)
        if self.trace is not None:
            _check_trace_path(self.trace)
        # Read now: a missing or corrupt reference is an error here, not at
        # `fit()`; and the trace may be the same file, rewritten by `fit()`.
        self._reference = None if reference is None else _trace.load(reference)
        self.reference = reference
        self.every = every
        self.on_divergence = on_divergence
        self.variables_every = variables_every
        self.divergence: _diff.Divergence | None = None
        self.stopped_on_divergence = False
        self.profile_differences: dict[str, tuple[Any, Any]] = {}
        self.steps_recorded = 0
        # Set by `on_train_begin`; None until then (a `fit` may fail before).
        self._writer: _trace.TraceWriter | None = None
        self._batches: _batches.BatchWatch | None = None

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        # Here, before `fit` traces its train function: each step then
        # leaves its batch's fingerprint for the trace (`data`).
        self._batches = _batches.watch(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        from tfdet._pin import _distribution, _environment
        from tfdet._setup import _enable

        self.divergence = None
        self.stopped_on_divergence = False
        self.profile_differences = {}
        self.steps_recorded = 0
        self._steps_compared = 0
        self._last_step = -1
        self._epoch = 0
        self._epoch_start = 0
        self._last_batch = -1
        self._variables = list(self.model.weights)
        self._names = _bits.variable_names(self._variables)
        profile = _enable.observed_profile()
        self._expected: dict[int, dict[str, Any]] = {}
        self._reference_names: list[str] | None = None
        if self._reference is not None:
            reference = self._reference
            self._expected = reference.by_step()
            # Fingerprints are matched by position; names may differ only by
            # Keras's auto-numbering (a second model in one process). Names
            # are only used when the variable counts agree.
            if len(reference.variables or []) == len(self._names):
                self._reference_names = reference.variables
            if reference.profile is not None:
                self.profile_differences = reference.profile.differences(profile)
            if self.profile_differences:
                error = ProfileMismatchError(
                    "The reference trace was recorded under another tfdet profile "
                    "(reference vs this run): "
                    + ", ".join(
                        f"{name}={old!r} vs {new!r}"
                        for name, (old, new) in self.profile_differences.items()
                    )
                    + ". Bits are compared anyway; expect them to differ.",
                    self.profile_differences,
                )
                # Reported once, as a warning (absl and logging show it too).
                warnings.warn(str(error), stacklevel=2)

        self._writer = None
        if self.trace is not None:
            header = _trace.make_header(
                profile,
                _environment.fingerprint(_enable.profile()),
                self._names,
                every=self.every,
                variables_every=self.variables_every,
                distribution=_distribution.describe(
                    getattr(self.model, "distribute_strategy", None)
                ),
            )
            self._writer = _trace.TraceWriter(self.trace, header)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._epoch_start += self._last_batch + 1
        self._last_batch = -1

    def on_train_batch_end(
        self, batch: int, logs: dict[str, Any] | None = None
    ) -> None:
        # tf_keras resumes its step count from its checkpoint, as a NumPy
        # integer, which JSON cannot write.
        batch = int(batch)
        # With steps_per_execution > 1, Keras reports the last batch of each
        # execution; the global step follows the batch index, not the calls.
        self._last_batch = batch
        step = self._epoch_start + batch
        if step % self.every:
            return
        self._last_step = step
        record = self._record(step, batch, logs or {})
        if self._writer is not None:
            self._writer.write_step(record)
        self.steps_recorded += 1
        if step not in self._expected:
            return
        self._steps_compared += 1
        if self.divergence is None:
            divergence = _diff.compare_steps(
                self._expected[step], record, self._reference_names
            )
            if divergence is not None:
                self.divergence = divergence
                self._act(divergence)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._close()
        # WARNING, not INFO: absl and Python's logging hide INFO by default,
        # and a summary nobody sees says nothing.
        _LOG.warning("%s", self.summary())
        if self.reference is None or self.divergence is not None:
            return
        if self._unchecked():
            warnings.warn(self.summary(), stacklevel=2)

    def _reference_name(self) -> str:
        if isinstance(self.reference, (str, os.PathLike)):
            return os.fspath(self.reference)
        return "the reference trace"

    def _unchecked(self) -> bool:
        expected = sum(1 for step in self._expected if step <= self._last_step)
        return self._steps_compared < expected or (
            self._steps_compared < self.steps_recorded
        )

    def summary(self) -> str:
        """One line on what the last `fit` found; logged at its end."""
        if not hasattr(self, "_expected"):
            return "tfdet: no fit has run with this callback yet"
        recorded = (
            f"; {self.steps_recorded} steps recorded to {self.trace}"
            if self.trace is not None
            else ""
        )
        if self.reference is None:
            where = "" if self.trace is None else f" to {self.trace}"
            return f"tfdet: {self.steps_recorded} steps recorded{where}"
        name = self._reference_name()
        if self.divergence is not None:
            if self.stopped_on_divergence:
                what = "training stopped (on_divergence='stop'; use 'raise' in CI)"
            else:
                what = "training went on (on_divergence='warn')"
            return (
                f"tfdet: bits diverged from reference {name}: "
                f"{self.divergence.describe()}; {what}{recorded}"
            )
        if self._unchecked():
            expected = sum(1 for step in self._expected if step <= self._last_step)
            return (
                f"tfdet: compared only {self._steps_compared} steps with the "
                f"reference, which has {expected} steps up to step "
                f"{self._last_step}; this run recorded {self.steps_recorded}. "
                "The traces record different steps (another `every`, or another "
                "number of batches per epoch?): the steps not compared are "
                "unchecked."
            )
        return (
            f"tfdet: {self._steps_compared} steps identical to reference "
            f"{name}{recorded}"
        )

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _record(self, step: int, batch: int, logs: dict[str, Any]) -> dict[str, Any]:
        return _trace.step_record(
            step,
            logs,
            _bits.weight_checksums(self._variables),
            epoch=self._epoch,
            batch=batch,
            with_variables=bool(self.variables_every)
            and self.steps_recorded % self.variables_every == 0,
            data=None if self._batches is None else self._batches.fingerprint(),
        )

    def _act(self, divergence: _diff.Divergence) -> None:
        message = f"tfdet: {divergence.describe()}"
        if self.on_divergence == "raise":
            # The trace stays readable: Keras does not call on_train_end when
            # a callback raises.
            self._close()
            raise divergence.to_error()
        if self.on_divergence == "warn":
            _LOG.warning("%s", message)
            warnings.warn(message, stacklevel=2)
            return
        _LOG.warning("%s Stopping training.", message)
        self.stopped_on_divergence = True
        self.model.stop_training = True


class DeterminismCallback(_DeterminismHooks, keras.callbacks.Callback):
    __doc__ = _DeterminismHooks.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> DeterminismCallback:
        if cls is DeterminismCallback and _tf_keras_in_use():
            cls = _tf_keras_class()
        return super().__new__(cls)


# `__new__` takes anything; show `__init__`'s arguments in help() and IDEs.
_INIT = inspect.signature(_DeterminismHooks.__init__)
DeterminismCallback.__signature__ = _INIT.replace(  # type: ignore[attr-defined]
    parameters=list(_INIT.parameters.values())[1:]
)


def _tf_keras_in_use() -> bool:
    return _versions.uses_legacy_keras() or "tf_keras" in sys.modules


_TfKerasDeterminismCallback: type[DeterminismCallback] | None = None


def _tf_keras_class() -> type[DeterminismCallback]:
    """`DeterminismCallback` that is also a tf_keras `Callback` (made once).

    tf_keras is imported only when it is in use: importing tfdet must not
    import it.
    """
    global _TfKerasDeterminismCallback
    if _TfKerasDeterminismCallback is None:
        import tf_keras

        _TfKerasDeterminismCallback = type(
            "_TfKerasDeterminismCallback",
            (DeterminismCallback, tf_keras.callbacks.Callback),
            {"__module__": __name__, "__doc__": DeterminismCallback.__doc__},
        )
    return _TfKerasDeterminismCallback
