"""`tfdet.DeterminismCallback`: record a step trace, compare it live.

The Keras base class is chosen when this module is imported: tf_keras's when
`TF_USE_LEGACY_KERAS=1` (as `tf.keras` then is tf_keras), Keras 3's otherwise.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import numpy as np

from tfdet import _bits, _diff, _trace, _versions
from tfdet._errors import ProfileMismatchError

_LOG = logging.getLogger("tfdet")

_ACTIONS = ("stop", "raise", "warn")
# tf_keras in tf.compat.v1 graph mode logs the batch index and size too.
_BOOKKEEPING_LOGS = frozenset({"batch", "size"})

if _versions.uses_legacy_keras():
    import tf_keras

    _Callback = tf_keras.callbacks.Callback
else:
    import keras

    _Callback = keras.callbacks.Callback


def _weight_checksums(variables: list[Any]) -> np.ndarray:
    import tensorflow as tf

    if tf.executing_eagerly():
        return _bits.device_checksums(variables)
    # tf.compat.v1 graph mode has no eager tf.function: read on the host and
    # fold each variable's SHA-256 into the same (n, 2) uint32 layout.
    backend = tf.compat.v1.keras.backend
    values = backend.batch_get_value(variables)
    digests = [_bits.array_digest(value) for value in values]
    return np.array(
        [[int(d[:8], 16), int(d[8:16], 16)] for d in digests], dtype=np.uint32
    )


def _logged_bits(value: Any) -> dict[str, str]:
    try:
        return _bits.logged_value_bits(value)
    except ValueError:
        # A metric that logs an array (e.g. per-class values): keep its digest.
        array = np.asarray(value)
        return {
            "dtype": array.dtype.name,
            "bits": _bits.array_digest(array),
            "value": "array",
        }


def _variable_names(variables: list[Any]) -> list[str]:
    names = [getattr(v, "path", None) or v.name for v in variables]
    # Keras 3 paths are unique; tf_keras names may repeat across layers.
    if len(set(names)) != len(names):
        names = [f"{index}:{name}" for index, name in enumerate(names)]
    return names


class DeterminismCallback(_Callback):
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
    the first step of that `fit`.

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
            the step, the quantity, both values and the ulp distance and sets
            `model.stop_training`; `"raise"` raises `tfdet.DivergenceError`
            with the same facts; `"warn"` warns and trains on.
        variables_every: Also record one fingerprint per variable every
            `variables_every`-th recorded step (0: never). They let `tfdet
            diff` name the first differing variable.

    Attributes:
        divergence: The first difference found in the last `fit`, or None.
        profile_differences: `{field: (reference, this run)}` of the profiles.
        steps_recorded: Number of steps recorded in the last `fit`.

    Raises:
        ValueError: an argument is out of range.
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
        self.reference = reference
        self.every = every
        self.on_divergence = on_divergence
        self.variables_every = variables_every
        self.divergence: _diff.Divergence | None = None
        self.profile_differences: dict[str, tuple[Any, Any]] = {}
        self.steps_recorded = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        from tfdet import _enable, _environment

        self.divergence = None
        self.profile_differences = {}
        self.steps_recorded = 0
        self._epoch = 0
        self._epoch_start = 0
        self._last_batch = -1
        self._variables = list(self.model.weights)
        self._names = _variable_names(self._variables)
        profile = _enable.observed_profile()
        self._expected: dict[int, dict[str, Any]] = {}
        self._reference_names: list[str] | None = None
        if self.reference is not None:
            # Read before the trace is opened: it may be the same file.
            reference = _trace.load(self.reference)
            self._expected = reference.by_step()
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
                _LOG.warning("tfdet: %s", error)
                warnings.warn(str(error), stacklevel=2)

        self._writer = None
        if self.trace is not None:
            header = _trace.make_header(
                profile,
                _environment.fingerprint(),
                self._names,
                every=self.every,
                variables_every=self.variables_every,
            )
            self._writer = _trace.TraceWriter(self.trace, header)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._epoch_start += self._last_batch + 1
        self._last_batch = -1

    def on_train_batch_end(
        self, batch: int, logs: dict[str, Any] | None = None
    ) -> None:
        # With steps_per_execution > 1, Keras reports the last batch of each
        # execution; the global step follows the batch index, not the calls.
        self._last_batch = batch
        step = self._epoch_start + batch
        if step % self.every:
            return
        record = self._record(step, batch, logs or {})
        if self._writer is not None:
            self._writer.write_step(record)
        self.steps_recorded += 1
        if self.divergence is None and step in self._expected:
            # Fingerprints are matched by position; names may differ only by
            # Keras's auto-numbering (a second model in one process).
            reference_names = self._reference_names or []
            names = (
                reference_names if len(reference_names) == len(self._names) else None
            )
            divergence = _diff.compare_steps(self._expected[step], record, names)
            if divergence is not None:
                self.divergence = divergence
                self._act(divergence)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._close()
        if self.reference is not None and self.divergence is None:
            _LOG.info(
                "tfdet: %d recorded steps match the reference bit for bit.",
                self.steps_recorded,
            )

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _record(self, step: int, batch: int, logs: dict[str, Any]) -> dict[str, Any]:
        values = {
            name: _logged_bits(value)
            for name, value in sorted(logs.items())
            if name not in _BOOKKEEPING_LOGS
        }
        checksums = _weight_checksums(self._variables)
        record: dict[str, Any] = {
            "epoch": self._epoch,
            "step": step,
            "batch": batch,
            "loss": values.pop("loss", None),
            "metrics": values,
            "weights": _trace.weights_fingerprint(checksums),
        }
        if self.variables_every and self.steps_recorded % self.variables_every == 0:
            record["variables"] = _trace.variable_fingerprints(checksums)
        return record

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
        self.model.stop_training = True
