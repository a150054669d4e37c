"""Step traces: the JSON Lines file a `DeterminismCallback` writes.

Line 1 is a header: `{"format": "tfdet-trace", "version": 2, "profile": ...,
"environment": ..., "variables": [names], ...}` with the `tfdet.Profile` and
the environment fingerprint of `tfdet env`. Every further line is one
training step:

    {"epoch": 0, "step": 3, "batch": 3, "data": "<16 hex digits>",
     "loss": {"dtype": "float32", "bits": "3f8ccccd", "value": "1.1"},
     "metrics": {"accuracy": {...}},
     "weights": "<32 hex digits>",
     "variables": ["<16 hex digits>", ...]}

`data`, where the recorder saw the batch, fingerprints the batch the step
trained on (inputs, targets, sample weights; `_batches`). `weights`
fingerprints every weight of the model exactly (any single flipped
bit changes it); `variables`, present every `variables_every` recorded steps,
holds one fingerprint per variable, in the order of the header's
`variables`. A metric that logs an array is recorded by its digest, with a
`"shape"` next to `dtype` and `bits` (`_bits.logged_value_bits`). Each line
is flushed as it is written, so a killed run leaves a file that reads back up
to its last whole step. `DeterminismCallback` and the runs of `tfdet check`
write the same records (`step_record`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdet._errors import TraceFormatError
from tfdet._pin._profile import Profile
from tfdet._record import _bits

FORMAT = "tfdet-trace"
# 2: weight fingerprints are sums of hashed words (`_bits.device_checksums`);
# version 1's linear sums cannot be compared with them.
VERSION = 2
OLDEST_VERSION = 2


def weights_fingerprint(checksums: np.ndarray) -> str:
    """One exact fingerprint of all weights from their per-variable checksums.

    Args:
        checksums: `_bits.device_checksums(...)` output, shape (n, 2) uint32.

    Returns:
        32 hex digits (a SHA-256 prefix over the checksums, in order).
    """
    array = np.ascontiguousarray(np.asarray(checksums, dtype=np.uint32))
    return hashlib.sha256(array.astype("<u4").tobytes()).hexdigest()[:32]


def variable_fingerprints(checksums: np.ndarray) -> list[str]:
    """One 16-hex-digit fingerprint per variable (its two 32-bit checksums)."""
    return _bits.checksum_hex(checksums)


# Logs Keras adds that are bookkeeping, not results (tf_keras in
# tf.compat.v1 graph mode logs the batch index and size).
_BOOKKEEPING_LOGS = frozenset({"batch", "size"})


def step_record(
    step: int,
    logs: Mapping[str, Any],
    checksums: np.ndarray,
    *,
    epoch: int = 0,
    batch: int | None = None,
    with_variables: bool = True,
    data: str | None = None,
) -> dict[str, Any]:
    """One step line: the logged loss and metrics as bits, weight fingerprints.

    Args:
        step: Global step (0-based).
        logs: What the training step logged (`{"loss": ..., "accuracy": ...}`).
        checksums: `_bits.weight_checksums` of the weights after the step.
        epoch: The step's epoch.
        batch: Its batch index in the epoch (default: `step`).
        with_variables: Also record one fingerprint per variable.
        data: The fingerprint of the batch the step trained on, when known.
    """
    values = {
        name: _bits.logged_value_bits(value)
        for name, value in sorted(logs.items())
        if name not in _BOOKKEEPING_LOGS
    }
    record: dict[str, Any] = {
        "epoch": epoch,
        "step": step,
        "batch": step if batch is None else batch,
        **({} if data is None else {"data": data}),
        "loss": values.pop("loss", None),
        "metrics": values,
        "weights": weights_fingerprint(checksums),
    }
    if with_variables:
        record["variables"] = variable_fingerprints(checksums)
    return record


def make_header(
    profile: Profile | Mapping[str, Any] | None,
    environment: Mapping[str, Any] | None,
    variables: Sequence[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The header line of a trace.

    Args:
        profile: The run's profile (a `Profile` or its dict), or None.
        environment: The environment fingerprint (`tfdet env` dict), or None.
        variables: Names of the model's variables, in fingerprint order.
        **extra: More JSON-ready facts (e.g. `every`).
    """
    if isinstance(profile, Profile):
        profile = profile.to_dict()
    return {
        "format": FORMAT,
        "version": VERSION,
        "profile": None if profile is None else dict(profile),
        "environment": None if environment is None else dict(environment),
        "variables": list(variables),
        **extra,
    }


class TraceWriter:
    """Writes a trace line by line, flushing each line.

    Example:

    >>> with TraceWriter("run.jsonl", header) as writer:  # doctest: +SKIP
    ...     writer.write_step({"epoch": 0, "step": 0, ...})
    """

    def __init__(self, path: str | os.PathLike[str], header: Mapping[str, Any]) -> None:
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._file: io.TextIOBase | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        # Steps of a killed process this one continues (see `continued`).
        self._kept: list[dict[str, Any]] = []
        self._write(header)

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._file is None:
            raise ValueError(
                f"Expected an open trace. Received: closed writer of {self.path!r}"
            )
        # One line per write, flushed: a killed process leaves whole lines only,
        # plus at most one cut line, which `read` drops with a warning.
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def write_step(self, record: Mapping[str, Any]) -> None:
        """Appends one step line."""
        self._write_kept(before=int(record["step"]))
        self._write(record)

    def keep(self, steps: Sequence[Mapping[str, Any]]) -> None:
        """Steps of a killed process to write before this one's first step.

        Those from that step on are dropped (this process trains them again);
        all are written at `close()` if this process writes no step.
        """
        self._kept = [dict(step) for step in steps]

    def _write_kept(self, before: int | None = None) -> None:
        for step in self._kept:
            if before is None or int(step["step"]) < before:
                self._write(step)
        self._kept = []

    def close(self) -> None:
        """Closes the file; closing twice is fine."""
        if self._file is not None:
            self._write_kept()
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def continued(path: str | os.PathLike[str], header: Mapping[str, Any]) -> TraceWriter:
    """A writer that continues the trace a killed process left at `path`.

    The new process's header replaces the old one (it records the process
    that resumed). The old steps, as far as they were written whole, are
    kept up to the first step the new process writes: it trains the rest
    again (or for the first time). No old trace: a plain `TraceWriter`.
    """
    try:
        kept = read(path).steps
    except (OSError, TraceFormatError):
        kept = []
    writer = TraceWriter(path, header)
    writer.keep(kept)
    return writer


@dataclasses.dataclass
class Trace:
    """A trace read back from a file.

    Attributes:
        header: The header dict (format, version, profile, environment, ...).
        steps: Step records, in file order.
        path: The file it was read from, if any.
        truncated: Whether the last line was cut (a killed run) and dropped.
    """

    header: dict[str, Any]
    steps: list[dict[str, Any]]
    path: str | None = None
    truncated: bool = False

    @property
    def profile(self) -> Profile | None:
        """The recorded `Profile`, or None when absent or incomplete."""
        data = self.header.get("profile")
        if not data:
            return None
        try:
            return Profile.from_dict(data)
        except (TypeError, ValueError):
            return None

    @property
    def environment(self) -> dict[str, Any]:
        """The recorded environment fingerprint ({} when absent)."""
        return dict(self.header.get("environment") or {})

    @property
    def variables(self) -> list[str]:
        """Variable names, in the order of each step's `variables` list."""
        return list(self.header.get("variables") or [])

    def by_step(self) -> dict[int, dict[str, Any]]:
        """Step records keyed by global step."""
        return {int(record["step"]): record for record in self.steps}


def read(path: str | os.PathLike[str]) -> Trace:
    """Reads a trace file.

    A last line cut in the middle (a run killed while writing) is dropped
    with a warning: the trace reads back up to its last whole step.

    Raises:
        TraceFormatError: the file cannot be read, is not a tfdet trace, has a
            newer format version, has a corrupt line before the last one, or
            records a step number twice.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceFormatError(
            f"Expected a readable tfdet trace file. Received: {path!r} ({error})"
        ) from error
    lines = text.split("\n")
    # A complete file ends with "\n", leaving one empty string at the end.
    complete_end = lines[-1] == ""
    if complete_end:
        lines.pop()
    if not lines:
        raise TraceFormatError(
            f"Expected a tfdet trace (JSON Lines, header first). Received: empty "
            f"file {path!r}"
        )
    header = _parse_header(lines[0], path, cut=len(lines) == 1 and not complete_end)
    steps: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    truncated = False
    for number, line in enumerate(lines[1:], start=2):
        is_last = number == len(lines)
        try:
            record = json.loads(line)
            _check_step(record)
        except ValueError as error:
            if is_last and not complete_end:
                truncated = True
                message = (
                    f"tfdet trace {path!r} ends with a cut line {number} (the run "
                    f"was killed while writing?); read {len(steps)} whole steps."
                )
                warnings.warn(message, stacklevel=2)
                break
            raise TraceFormatError(
                f"Expected a step record on line {number} of tfdet trace {path!r}. "
                f"Received: {line[:80]!r} ({error})"
            ) from error
        if record["step"] in seen:
            # Two records of one step cannot both be compared: refuse the file
            # rather than keep one silently.
            raise TraceFormatError(
                f"Expected each step once in tfdet trace {path!r}. Received: step "
                f"{record['step']} again on line {number} (first on line "
                f"{seen[record['step']]}). Was the file appended to by two runs?"
            )
        seen[record["step"]] = number
        steps.append(record)
    return Trace(header=header, steps=steps, path=path, truncated=truncated)


def _parse_header(line: str, path: str, cut: bool) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError as error:
        detail = (
            "its header line is cut" if cut else f"line 1 is not JSON: {line[:60]!r}"
        )
        raise TraceFormatError(
            f"Expected a tfdet trace (JSON Lines, header first). Received: {path!r}, "
            f"{detail}"
        ) from error
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceFormatError(
            f'Expected a tfdet trace, whose first line has "format": "{FORMAT}". '
            f"Received: {path!r}, first line {line[:60]!r}. Record one with "
            "`tfdet.DeterminismCallback(trace=...)`."
        )
    version = header.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TraceFormatError(
            f"Expected a tfdet trace whose header has an integer format version. "
            f"Received: version {version!r} in {path!r}."
        )
    if version > VERSION:
        raise TraceFormatError(
            f"Expected a tfdet trace of format version <= {VERSION}. Received: "
            f"version {version!r} in {path!r}. Upgrade tfdet to read it."
        )
    if version < OLDEST_VERSION:
        raise TraceFormatError(
            f"Expected a tfdet trace of format version >= {OLDEST_VERSION}. "
            f"Received: version {version!r} in {path!r}, whose weight fingerprints "
            "this tfdet computes differently. Record the trace again."
        )
    for key in ("profile", "environment"):
        if not isinstance(header.get(key), dict | None):
            raise TraceFormatError(
                f"Expected the header's {key!r} to be an object or null. Received: "
                f"{header.get(key)!r:.60} in {path!r}."
            )
    variables = header.get("variables")
    if variables is not None and not _is_str_list(variables):
        raise TraceFormatError(
            f"Expected the header's 'variables' to be a list of names. Received: "
            f"{variables!r:.60} in {path!r}."
        )
    return header


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_bits(name: str, value: Any) -> None:
    """A `_bits.value_bits` dict: a NumPy dtype name and a hex bit pattern."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not a bits object: {value!r:.40}")
    dtype, bits = value.get("dtype"), value.get("bits")
    try:
        if not isinstance(dtype, str) or not isinstance(bits, str):
            raise TypeError
        np.dtype(dtype)
        int(bits, 16)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} needs a dtype name and hex bits, got {value!r:.60}"
        ) from None


def _check_step(record: Any) -> None:
    """Raises ValueError unless `record` is a well-formed step record."""
    if not isinstance(record, dict) or "step" not in record:
        raise ValueError("not a step record")
    if not _is_int(record["step"]) or record["step"] < 0:
        raise ValueError(f"step is not an integer >= 0: {record['step']!r:.40}")
    for key in ("epoch", "batch"):
        if record.get(key) is not None and not _is_int(record[key]):
            raise ValueError(f"{key} is not an integer: {record[key]!r:.40}")
    if record.get("data") is not None and not isinstance(record["data"], str):
        raise ValueError(f"data is not a fingerprint string: {record['data']!r:.40}")
    if record.get("loss") is not None:
        _check_bits("loss", record["loss"])
    metrics = record.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise ValueError(f"metrics is not an object: {metrics!r:.40}")
        for name, value in metrics.items():
            _check_bits(f"metric {name!r}", value)
    if not isinstance(record.get("weights"), str):
        raise ValueError(
            f"weights is not a fingerprint string: {record.get('weights')!r:.40}"
        )
    variables = record.get("variables")
    if variables is not None and not _is_str_list(variables):
        raise ValueError(f"variables is not a list of strings: {variables!r:.40}")


def load(trace: str | os.PathLike[str] | Trace) -> Trace:
    """A `Trace` from a path, or the `Trace` itself."""
    return trace if isinstance(trace, Trace) else read(trace)
