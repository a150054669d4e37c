"""Every exception tfdet raises, and the CLI exit code each one maps to.

Exit codes are the same for every subcommand: 0 bit-identical or
nothing found, 1 divergence or hazards found, 2 usage or bad input, 3 a run
failed or timed out, 4 a requested device is not available.
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """The exit code of every `tfdet` subcommand, and `CheckReport.exit_code`.

    Integers, as pytest's `pytest.ExitCode`: `code == 0` and `sys.exit(code)`
    work as with plain ints, and the name says what the number means.
    """

    OK = 0  # Bit-identical, or nothing found.
    DIVERGED = 1  # Divergence or hazards found.
    USAGE = 2  # Usage error or bad input.
    RUN_FAILED = 3  # A run failed or timed out; never reported as 0 or 1.
    NO_DEVICE = 4  # A requested device is not available.


EXIT_OK = ExitCode.OK
EXIT_DIVERGED = ExitCode.DIVERGED
EXIT_USAGE = ExitCode.USAGE
EXIT_RUN_FAILED = ExitCode.RUN_FAILED
EXIT_NO_DEVICE = ExitCode.NO_DEVICE


class Error(Exception):
    """Base class of every tfdet exception."""

    exit_code: int = EXIT_USAGE


class TooLateError(Error):
    """A setting cannot take effect any more because TensorFlow already started.

    Attributes:
        setting: Name of the setting that can no longer change.
    """

    def __init__(self, setting: str, detail: str) -> None:
        self.setting = setting
        super().__init__(
            f"Too late to pin `{setting}`: {detail} Call `tfdet.enable()` at the "
            "top of the script, before any model, tensor or dataset is built, or "
            "start the script under `tfdet run script.py`, which sets it before "
            "Python and TensorFlow start."
        )


class ProfileMismatchError(Error):
    """Two profiles that must agree do not.

    Attributes:
        differences: `{field: (expected, received)}` for each differing field.
    """

    def __init__(self, message: str, differences: dict[str, tuple[Any, Any]]):
        self.differences = dict(differences)
        super().__init__(message)


class DivergenceError(Error):
    """A compared run produced different bits.

    Attributes:
        step: Global step index (0-based) of the first difference.
        quantity: What differs, e.g. `"loss"`, `"metric:accuracy"`, `"weights"`.
        expected: Value in the reference.
        received: Value in this run.
        ulps: Distance in units in the last place, when both are floats.
    """

    exit_code = EXIT_DIVERGED

    def __init__(
        self,
        step: int,
        quantity: str,
        expected: Any,
        received: Any,
        ulps: int | None = None,
        epoch: int | None = None,
    ) -> None:
        self.step = step
        self.quantity = quantity
        self.expected = expected
        self.received = received
        self.ulps = ulps
        self.epoch = epoch
        where = f"step {step}" if epoch is None else f"epoch {epoch}, step {step}"
        distance = "" if ulps is None else f" ({ulps} ulps apart)"
        super().__init__(
            f"Bits diverged at {where}, {quantity}: expected {expected!r}, "
            f"received {received!r}{distance}."
        )


class NondeterministicError(Error):
    """A construct whose results follow timing was used under `tfdet.enable()`.

    Raised where no setting can make the bits repeat (e.g. asynchronous
    parameter-server training); the message says what to use instead.

    Attributes:
        construct: What was refused, e.g. `"ParameterServerStrategy"`.
    """

    def __init__(self, construct: str, why: str, instead: str) -> None:
        self.construct = construct
        super().__init__(
            f"tfdet refuses {construct} under tfdet.enable(): {why} Use "
            f"{instead} instead, or leave its refusal out with "
            "`tfdet.enable(patches=[...])` and accept bits that change from run "
            "to run."
        )


class TargetError(Error, ValueError):
    """A TARGET cannot be loaded or does not return a compiled Keras model."""


class TraceFormatError(Error, ValueError):
    """A file is not a tfdet trace, or its header is unreadable."""


class ResumeError(Error, RuntimeError):
    """A backup cannot be resumed exactly: a damaged file (named), another
    training's state, or a position the resumed `fit` does not have (another
    epoch length, batch size or data size). Also a `RuntimeError`."""


class RunFailedError(Error):
    """A spawned training run crashed, failed to start, or timed out."""

    exit_code = EXIT_RUN_FAILED


class ReportWriteError(Error):
    """A report (`--json FILE`) could not be written after the work was done."""

    exit_code = EXIT_RUN_FAILED


class DeviceUnavailableError(Error):
    """A requested device (e.g. a GPU) is not visible to TensorFlow."""

    exit_code = EXIT_NO_DEVICE
