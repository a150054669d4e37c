"""Comparing traces: the first diverging step and what explains it.

Used live by `DeterminismCallback` (one step against its reference), by
`tfdet diff` (two whole traces) and by `tfdet check` (the traces of its runs,
plus their final weights). Differences in the profile and the environment
fingerprint are reported before bits: they usually explain them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdet._errors import DivergenceError, RunFailedError
from tfdet._pin import _environment
from tfdet._record import _bits, _layer_walk
from tfdet._record._trace import Trace

# Fingerprint keys that differ between any two runs and explain nothing.
_VOLATILE_FINGERPRINT_KEYS = ("profile",)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first difference between two step records.

    Attributes:
        step: Global step (0-based).
        epoch: Epoch of the step, when recorded.
        quantity: `"data"` (the batch the step trained on: its inputs,
            targets or sample weights differ), `"loss"`, `"metric:NAME"`, `"weights"`,
            `"weights:VARIABLE"` (the first differing variable, when
            per-variable fingerprints exist at that step), or `"steps"` (the
            step is recorded in only one of the traces).
            `tfdet check` also reports `"final weights:VARIABLE"` (the
            exact digest of a variable after the last step).
        expected: The reference's value, formatted with its bits
            (`_bits.show`).
        received: This run's (or trace B's) value, formatted with its bits.
        ulps: Units in the last place between the two, for floats.
        detail: For weights, when both runs' final values are at hand: the
            first differing element of the variable's final value, how many
            elements differ and by how many ulps at most (`weights_detail`).
    """

    step: int
    epoch: int | None
    quantity: str
    expected: str
    received: str
    ulps: int | None = None
    detail: dict[str, Any] | None = None

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
        """One line for logs: where, what, both values, the ulp distance.

        With `detail`, a second sentence on the variable's final value.
        """
        text = str(self.to_error())
        d = self.detail
        if d and "expected" in d:
            text += (
                f" In its final value {d['differing_elements']} of {d['size']} "
                f"elements differ (max {d['max_ulps']} ulps), first at "
                f"{tuple(d['index'])}: {_bits.show(d['expected'])} vs "
                f"{_bits.show(d['received'])} ({d['ulps']} ulps)."
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def weights_detail(file_a: str, file_b: str, index: int) -> dict[str, Any] | None:
    """First differing element of variable `index`'s value in two `.npz` files.

    The files hold the final weights of two runs (`np.savez(path, *weights)`),
    so this describes the variable's value after the last step (it keeps
    diverging once it has). None when the files cannot be read.
    """
    try:
        with np.load(file_a) as wa, np.load(file_b) as wb:
            xa, xb = wa[f"arr_{index}"], wb[f"arr_{index}"]
    except (OSError, KeyError, ValueError):
        return None
    if xa.shape != xb.shape or xa.dtype != xb.dtype:
        return {
            "shape": [list(xa.shape), list(xb.shape)],
            "dtype": [str(xa.dtype), str(xb.dtype)],
        }
    width = xa.dtype.itemsize
    if width not in (2, 4, 8):
        return None
    ua = xa.view(f"u{width}").ravel()
    ub = xb.view(f"u{width}").ravel()
    differing = np.flatnonzero(ua != ub)
    if differing.size == 0:
        return {"differing_elements": 0, "size": int(ua.size)}
    first = int(differing[0])
    va = _bits.value_bits(xa.ravel()[first])
    vb = _bits.value_bits(xb.ravel()[first])
    all_ulps = None
    if np.issubdtype(xa.dtype, np.floating) and width < 8:
        sign = np.int64(1) << (8 * width - 1)
        ia, ib = ua.astype(np.int64), ub.astype(np.int64)
        ia = np.where(ia & sign, -(ia & (sign - 1)), ia)
        ib = np.where(ib & sign, -(ib & (sign - 1)), ib)
        all_ulps = int(np.max(np.abs(ia - ib)))
    return {
        "index": [int(i) for i in np.unravel_index(first, xa.shape)],
        "expected": va,
        "received": vb,
        "ulps": _bits.ulp_distance(va, vb),
        "differing_elements": int(differing.size),
        "size": int(ua.size),
        "max_ulps": all_ulps,
    }


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
    return quantity, _bits.show(expected), _bits.show(received), ulps


def compare_steps(
    expected: Mapping[str, Any],
    received: Mapping[str, Any],
    variables: list[str] | None = None,
) -> Divergence | None:
    """The first differing quantity of two records of the same step, or None.

    Quantities are checked in the order they are computed: the batch the
    step trained on (where both records have it), the loss, the metrics (by
    name), then the weights after the update.

    Args:
        expected: The reference record.
        received: The record to check.
        variables: Variable names for per-variable fingerprints.
    """
    step = int(received.get("step", expected.get("step", -1)))
    epoch = received.get("epoch", expected.get("epoch"))
    found: tuple[str, str, str, int | None] | None = None
    data_a, data_b = expected.get("data"), received.get("data")
    if data_a is not None and data_b is not None and data_a != data_b:
        # Another batch: what follows from it (loss, weights) differs too.
        found = ("data", data_a, data_b, None)
    if found is None:
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


def _differing(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """`{key: (A, B)}` for the keys whose values differ (absent: None)."""
    return {
        name: (a.get(name), b.get(name))
        for name in sorted(set(a) | set(b))
        if a.get(name) != b.get(name)
    }


def profile_differences(a: Trace, b: Trace) -> dict[str, tuple[Any, Any]]:
    """`{field: (A, B)}` for the profile fields that differ."""
    return _differing(a.header.get("profile") or {}, b.header.get("profile") or {})


def fingerprint_differences(a: Trace, b: Trace) -> dict[str, tuple[Any, Any]]:
    """`{dotted.key: (A, B)}` for the environment fingerprint facts that differ."""
    env_a = {
        k: v for k, v in a.environment.items() if k not in _VOLATILE_FINGERPRINT_KEYS
    }
    env_b = {
        k: v for k, v in b.environment.items() if k not in _VOLATILE_FINGERPRINT_KEYS
    }
    return _differing(_flatten(env_a), _flatten(env_b))


def distribution_differences(a: Trace, b: Trace) -> dict[str, tuple[Any, Any]]:
    """`{key: (A, B)}` for the `tf.distribute` facts that differ.

    Two workers of one run differ in `worker` (their task index) and agree
    in everything else; a trace without a strategy has none of the keys.
    """
    return _differing(
        _flatten(a.header.get("distribution") or {}),
        _flatten(b.header.get("distribution") or {}),
    )


@dataclasses.dataclass(frozen=True)
class TraceComparison:
    """The result of comparing trace A with trace B.

    Attributes:
        profile_differences: `{field: (A, B)}` of the profiles.
        fingerprint_differences: `{key: (A, B)}` of the environment facts.
        divergence: The first differing step and quantity, or None.
        steps_compared: Number of steps present in both traces (0 when
            both hold no step: nothing was compared, which is not equality).
        steps: `(steps in A, steps in B)`.
        truncated: `(A was cut, B was cut)`.
        cpu_differences: The CPU facts that differ, each with whether it is
            expected to change bits and why (`_environment.compare_cpus`).
        variables: `(variables in A, variables in B)`: traces of two
            different models cannot agree.
        distribution_differences: `{key: (A, B)}` of the `tf.distribute`
            facts (strategy, replicas, workers, worker, collective).
        layer_location: For two `tfdet locate --record` traces, where their
            layer records first differ (a `Location` dict), else None.
        layers_compared: Whether both traces held layer records of the same
            layers, so that `layer_location` None means no layer differs.
    """

    profile_differences: dict[str, tuple[Any, Any]]
    fingerprint_differences: dict[str, tuple[Any, Any]]
    divergence: Divergence | None
    steps_compared: int
    steps: tuple[int, int]
    truncated: tuple[bool, bool]
    cpu_differences: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    variables: tuple[int, int] = (0, 0)
    distribution_differences: dict[str, tuple[Any, Any]] = dataclasses.field(
        default_factory=dict
    )
    layer_location: dict[str, Any] | None = None
    layers_compared: bool = False

    @property
    def empty(self) -> bool:
        """Whether neither trace holds a step: there were no bits to compare."""
        return self.steps == (0, 0)

    @property
    def identical(self) -> bool:
        """Whether both traces hold the same steps, with the same bits.

        A step recorded in only one trace is a divergence (quantity
        `"steps"`). Two traces without steps are not identical: nothing was
        compared (`empty`).
        """
        return self.divergence is None and not self.empty

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "empty": self.empty,
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
            "cpu_differences": self.cpu_differences,
            "variables": list(self.variables),
            "distribution_differences": {
                k: list(v) for k, v in self.distribution_differences.items()
            },
            "layer_location": self.layer_location,
            "layers_compared": self.layers_compared,
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


def variable_index(quantity: str, names: Sequence[str]) -> int | None:
    """The index of the variable a `"weights:NAME"` quantity names, or None."""
    _, _, name = quantity.partition(":")
    return names.index(name) if name in names else None


def first_divergence(a: Trace, b: Trace) -> Divergence | None:
    """The earliest step where trace A (the expected one) and trace B part,
    or None when they hold the same steps with the same bits.

    A step whose bits differ, or a step recorded in only one of them
    (quantity `"steps"`; e.g. a run killed early, or another `every`).
    """
    return _step_divergence(a, b, a.by_step(), b.by_step())


def _step_divergence(
    a: Trace,
    b: Trace,
    steps_a: Mapping[int, dict[str, Any]],
    steps_b: Mapping[int, dict[str, Any]],
) -> Divergence | None:
    """`first_divergence`, given each trace's steps keyed by step."""
    # Fingerprints are matched by position; A's names label them.
    variables = a.variables if len(a.variables) == len(b.variables) else None
    divergence = None
    for step in sorted(set(steps_a) & set(steps_b)):
        divergence = compare_steps(steps_a[step], steps_b[step], variables)
        if divergence is not None:
            break
    unmatched = set(steps_a) ^ set(steps_b)
    if unmatched and (divergence is None or min(unmatched) < divergence.step):
        divergence = _missing_step(min(unmatched), steps_a, steps_b)
    return divergence


def compare(a: Trace, b: Trace) -> TraceComparison:
    """Compares trace A (the expected one) with trace B, step by step.

    Traces agree only when they hold the same set of steps with the same
    bits (`first_divergence`); the profile, environment and distribution
    facts that differ are reported beside it.
    """
    steps_a, steps_b = a.by_step(), b.by_step()
    return TraceComparison(
        profile_differences=profile_differences(a, b),
        fingerprint_differences=fingerprint_differences(a, b),
        divergence=_step_divergence(a, b, steps_a, steps_b),
        steps_compared=len(set(steps_a) & set(steps_b)),
        steps=(len(a.steps), len(b.steps)),
        truncated=(a.truncated, b.truncated),
        variables=(len(a.variables), len(b.variables)),
        distribution_differences=distribution_differences(a, b),
        **_layer_comparison(a, b),
        cpu_differences=_environment.compare_cpus(a.environment, b.environment),
    )


def _layer_comparison(a: Trace, b: Trace) -> dict[str, Any]:
    """`layer_location` and `layers_compared` of two traces."""
    record_a = _layer_walk.from_trace(a.header, a.steps)
    record_b = _layer_walk.from_trace(b.header, b.steps)
    if record_a is None or record_b is None:
        return {}
    try:
        location = _layer_walk.locate_results(record_a, record_b)
    except RunFailedError:  # Other layers: the walk cannot pair them.
        return {}
    return {
        "layer_location": None if location is None else location.to_dict(),
        "layers_compared": True,
    }
