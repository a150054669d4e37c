"""Comparing traces: the first diverging step and what explains it.

Used live by `DeterminismCallback` (one step against its reference) and by
`tfdet diff` (two whole traces). Differences in the profile and the
environment fingerprint are reported before bits: they usually explain them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfdet._errors import DivergenceError
from tfdet._record import _bits
from tfdet._record._trace import Trace

# Fingerprint keys that differ between any two runs and explain nothing.
_VOLATILE_FINGERPRINT_KEYS = ("profile",)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first difference between two step records.

    Attributes:
        step: Global step (0-based).
        epoch: Epoch of the step, when recorded.
        quantity: `"loss"`, `"metric:NAME"`, `"weights"`,
            `"weights:VARIABLE"` (the first differing variable, when
            per-variable fingerprints exist at that step), or `"steps"` (the
            step is recorded in only one of the traces).
        expected: The reference's value, formatted with its bits.
        received: This run's (or trace B's) value, formatted with its bits.
        ulps: Units in the last place between the two, for floats.
    """

    step: int
    epoch: int | None
    quantity: str
    expected: str
    received: str
    ulps: int | None = None

    def to_error(self) -> DivergenceError:
        """The same facts as a `tfdet.DivergenceError`."""
        return DivergenceError(
            self.step,
            self.quantity,
            self.expected,
            self.received,
            self.ulps,
            self.epoch,
        )

    def describe(self) -> str:
        """One line for logs: where, what, both values, the ulp distance."""
        return str(self.to_error())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def format_bits(bits: Mapping[str, str] | None) -> str:
    """`value [dtype 0xBITS]` for a `value_bits` dict, `(absent)` for None."""
    if bits is None:
        return "(absent)"
    return f"{bits.get('value')} [{bits.get('dtype')} 0x{bits.get('bits')}]"


def _compare_values(
    quantity: str,
    expected: Mapping[str, str] | None,
    received: Mapping[str, str] | None,
) -> tuple[str, str, str, int | None] | None:
    if expected is None and received is None:
        return None
    if expected is not None and received is not None:
        if expected.get("dtype") == received.get("dtype") and expected.get(
            "bits"
        ) == received.get("bits"):
            return None
        ulps = _bits.ulp_distance(dict(expected), dict(received))
    else:
        ulps = None
    return quantity, format_bits(expected), format_bits(received), ulps


def compare_steps(
    expected: Mapping[str, Any],
    received: Mapping[str, Any],
    variables: list[str] | None = None,
) -> Divergence | None:
    """The first differing quantity of two records of the same step, or None.

    Quantities are checked in the order they are computed: the loss, the
    metrics (by name), then the weights after the update.

    Args:
        expected: The reference record.
        received: The record to check.
        variables: Variable names for per-variable fingerprints.
    """
    step = int(received.get("step", expected.get("step", -1)))
    epoch = received.get("epoch", expected.get("epoch"))
    found = _compare_values("loss", expected.get("loss"), received.get("loss"))
    if found is None:
        metrics_a = expected.get("metrics") or {}
        metrics_b = received.get("metrics") or {}
        for name in sorted(set(metrics_a) | set(metrics_b)):
            found = _compare_values(
                f"metric:{name}", metrics_a.get(name), metrics_b.get(name)
            )
            if found is not None:
                break
    if found is None and expected.get("weights") != received.get("weights"):
        found = (
            "weights",
            str(expected.get("weights")),
            str(received.get("weights")),
            None,
        )
        per_a, per_b = expected.get("variables"), received.get("variables")
        if per_a and per_b:
            for index, (a, b) in enumerate(zip(per_a, per_b, strict=False)):
                if a != b:
                    name = (
                        variables[index]
                        if variables and index < len(variables)
                        else index
                    )
                    found = (f"weights:{name}", a, b, None)
                    break
    if found is None:
        return None
    quantity, expected_text, received_text, ulps = found
    return Divergence(step, epoch, quantity, expected_text, received_text, ulps)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def profile_differences(a: Trace, b: Trace) -> dict[str, tuple[Any, Any]]:
    """`{field: (A, B)}` for the profile fields that differ."""
    profile_a = a.header.get("profile") or {}
    profile_b = b.header.get("profile") or {}
    return {
        name: (profile_a.get(name), profile_b.get(name))
        for name in sorted(set(profile_a) | set(profile_b))
        if profile_a.get(name) != profile_b.get(name)
    }


def fingerprint_differences(a: Trace, b: Trace) -> dict[str, tuple[Any, Any]]:
    """`{dotted.key: (A, B)}` for the environment fingerprint facts that differ."""
    env_a = {
        k: v for k, v in a.environment.items() if k not in _VOLATILE_FINGERPRINT_KEYS
    }
    env_b = {
        k: v for k, v in b.environment.items() if k not in _VOLATILE_FINGERPRINT_KEYS
    }
    flat_a, flat_b = _flatten(env_a), _flatten(env_b)
    return {
        name: (flat_a.get(name), flat_b.get(name))
        for name in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(name) != flat_b.get(name)
    }


@dataclasses.dataclass(frozen=True)
class TraceComparison:
    """The result of comparing trace A with trace B.

    Attributes:
        profile_differences: `{field: (A, B)}` of the profiles.
        fingerprint_differences: `{key: (A, B)}` of the environment facts.
        divergence: The first differing step and quantity, or None.
        steps_compared: Number of steps present in both traces.
        steps: `(steps in A, steps in B)`.
        truncated: `(A was cut, B was cut)`.
    """

    profile_differences: dict[str, tuple[Any, Any]]
    fingerprint_differences: dict[str, tuple[Any, Any]]
    divergence: Divergence | None
    steps_compared: int
    steps: tuple[int, int]
    truncated: tuple[bool, bool]

    @property
    def identical(self) -> bool:
        """Whether both traces hold the same steps, with the same bits.

        A step recorded in only one trace is a divergence (quantity
        `"steps"`), so no divergence means identical.
        """
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "profile_differences": {
                k: list(v) for k, v in self.profile_differences.items()
            },
            "fingerprint_differences": {
                k: list(v) for k, v in self.fingerprint_differences.items()
            },
            "divergence": None
            if self.divergence is None
            else self.divergence.to_dict(),
            "steps_compared": self.steps_compared,
            "steps": list(self.steps),
            "truncated": list(self.truncated),
        }


def _missing_step(step: int, a: Mapping[int, Any], b: Mapping[int, Any]) -> Divergence:
    """The divergence of a step recorded in only one of two traces."""
    present = a.get(step) or b.get(step)
    epoch = present.get("epoch") if present else None

    def state(steps: Mapping[int, Any]) -> str:
        if step in steps:
            return "recorded"
        last = max(steps, default=None)
        return f"not recorded (last recorded step: {last})"

    return Divergence(step, epoch, "steps", state(a), state(b))


def compare(a: Trace, b: Trace) -> TraceComparison:
    """Compares trace A (the expected one) with trace B, step by step.

    Traces agree only when they hold the same set of steps with the same
    bits. The divergence is the earliest step where they part: a step whose
    bits differ, or a step recorded in only one of them (quantity
    `"steps"`; e.g. a run killed early, or another `every`).
    """
    steps_a, steps_b = a.by_step(), b.by_step()
    common = sorted(set(steps_a) & set(steps_b))
    # Fingerprints are matched by position; A's names label them.
    variables = a.variables if len(a.variables) == len(b.variables) else None
    divergence = None
    for step in common:
        divergence = compare_steps(steps_a[step], steps_b[step], variables)
        if divergence is not None:
            break
    unmatched = set(steps_a) ^ set(steps_b)
    if unmatched and (divergence is None or min(unmatched) < divergence.step):
        divergence = _missing_step(min(unmatched), steps_a, steps_b)
    return TraceComparison(
        profile_differences=profile_differences(a, b),
        fingerprint_differences=fingerprint_differences(a, b),
        divergence=divergence,
        steps_compared=len(common),
        steps=(len(a.steps), len(b.steps)),
        truncated=(a.truncated, b.truncated),
    )
