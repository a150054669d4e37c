"""tfdet: bit-for-bit reproducible Keras/TensorFlow training, and the proof.

Importing tfdet does not import TensorFlow and changes nothing: settings that
TensorFlow reads at import must still be pinnable by `tfdet.enable()`.
"""

from __future__ import annotations

from typing import Any

from tfdet._errors import (
    DeviceUnavailableError,
    DivergenceError,
    Error,
    ExitCode,
    NondeterministicError,
    ProfileMismatchError,
    ResumeError,
    RunFailedError,
    TargetError,
    TooLateError,
    TraceFormatError,
)
from tfdet._pin._profile import Profile
from tfdet._setup._enable import coverage, enable, is_enabled, profile
from tfdet._version import __version__

__all__ = [
    "CheckReport",
    "DeterminismCallback",
    "DeviceUnavailableError",
    "DivergenceError",
    "Error",
    "ExitCode",
    "NondeterministicError",
    "Profile",
    "ProfileMismatchError",
    "ResumeError",
    "RunFailedError",
    "TargetError",
    "TooLateError",
    "TraceFormatError",
    "__version__",
    "check",
    "coverage",
    "enable",
    "is_enabled",
    "profile",
    "random_state",
]


def __getattr__(name: str) -> Any:
    # The callback subclasses a Keras class; importing Keras imports
    # TensorFlow, so it is loaded on first use only.
    if name == "DeterminismCallback":
        from tfdet._record._callback import DeterminismCallback

        return DeterminismCallback
    if name == "random_state":
        from tfdet._resume._keras3 import random_state

        return random_state
    if name in ("check", "CheckReport"):
        # Not imported with tfdet: the check's modules are not needed to
        # enable() (none of them imports TensorFlow either).
        from tfdet._commands import _api

        return getattr(_api, name)
    raise AttributeError(f"module 'tfdet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
