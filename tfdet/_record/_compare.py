"""Bit-for-bit comparison of two recorded runs: the first place they part.

Order of comparison: step by step; inside a step the loss, then each metric
(sorted by name), then each variable's checksum in the model's order; after
the last step, each variable's exact final digest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tfdet._record import _bits


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first difference between two runs.

    Attributes:
        step: 0-based step index (None for a difference found only in the
            final weights, or in the number of steps).
        quantity: "loss", "metric:NAME", "weights:VARIABLE" or "steps".
        expected: The baseline's value (a `value_bits` dict or a string).
        received: The other run's value.
        ulps: Distance in ulps for scalar floats, else None.
        detail: For weights: the first differing element and how many differ.
    """

    step: int | None
    quantity: str
    expected: Any
    received: Any
    ulps: int | None = None
    detail: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _value_order(names: set[str]) -> list[str]:
    return sorted(names, key=lambda name: (name != "loss", name))


def first_divergence(
    baseline: dict[str, Any], other: dict[str, Any]
) -> Divergence | None:
    """The first difference between two worker results, or None if identical."""
    variables = baseline["variables"]
    for a, b in zip(baseline["steps"], other["steps"], strict=False):
        step = a["step"]
        for name in _value_order(set(a["values"]) | set(b["values"])):
            va, vb = a["values"].get(name), b["values"].get(name)
            if (
                va is None
                or vb is None
                or va["bits"] != vb["bits"]
                or va["dtype"] != vb["dtype"]
            ):
                quantity = "loss" if name == "loss" else f"metric:{name}"
                ulps = None if va is None or vb is None else _bits.ulp_distance(va, vb)
                return Divergence(step, quantity, va, vb, ulps)
        for index, (ca, cb) in enumerate(zip(a["weights"], b["weights"], strict=False)):
            if ca != cb:
                name = variables[index] if index < len(variables) else str(index)
                return Divergence(
                    step,
                    f"weights:{name}",
                    ca,
                    cb,
                    None,
                    _weights_detail(baseline, other, index),
                )
        if len(a["weights"]) != len(b["weights"]):
            return Divergence(
                step, "weights:count", len(a["weights"]), len(b["weights"])
            )
    if len(baseline["steps"]) != len(other["steps"]):
        return Divergence(None, "steps", len(baseline["steps"]), len(other["steps"]))
    for index, name in enumerate(variables):
        da = baseline["final_weights"].get(name)
        db = other["final_weights"].get(name)
        if da != db:
            return Divergence(
                None,
                f"weights:{name}",
                da,
                db,
                None,
                _weights_detail(baseline, other, index),
            )
    return None


def _weights_detail(
    a: dict[str, Any], b: dict[str, Any], index: int
) -> dict[str, Any] | None:
    """First differing element of a variable's final value, from saved weights.

    The weights are only saved at the end, so this describes the final value
    of the variable that first diverged (it keeps diverging once it has).
    """
    try:
        with np.load(a["weights_file"]) as wa, np.load(b["weights_file"]) as wb:
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
    ulps = _bits.ulp_distance(va, vb)
    all_ulps = None
    if np.issubdtype(xa.dtype, np.floating):
        ia = ua.astype(np.int64) if width < 8 else ua.view(np.int64)
        ib = ub.astype(np.int64) if width < 8 else ub.view(np.int64)
        sign = np.int64(1) << (8 * width - 1) if width < 8 else None
        if sign is not None:
            ia = np.where(ia & sign, -(ia & (sign - 1)), ia)
            ib = np.where(ib & sign, -(ib & (sign - 1)), ib)
            all_ulps = int(np.max(np.abs(ia - ib)))
    return {
        "index": [int(i) for i in np.unravel_index(first, xa.shape)],
        "expected": va,
        "received": vb,
        "ulps": ulps,
        "differing_elements": int(differing.size),
        "size": int(ua.size),
        "max_ulps": all_ulps,
    }


def describe(divergence: Divergence) -> str:
    """One human line: where, what, both values in hex and decimal, ulps."""
    where = (
        "after the last step" if divergence.step is None else f"step {divergence.step}"
    )
    if divergence.quantity.startswith("weights:") and divergence.detail:
        d = divergence.detail
        if "expected" in d:
            return (
                f"{where}, {divergence.quantity}; in its final value "
                f"{d['differing_elements']} of {d['size']} elements differ "
                f"(max {d['max_ulps']} ulps), first at "
                f"{tuple(d['index'])}: {_show(d['expected'])} vs {_show(d['received'])} "
                f"({d['ulps']} ulps)"
            )
    if isinstance(divergence.expected, dict) and isinstance(divergence.received, dict):
        ulps = "" if divergence.ulps is None else f" ({divergence.ulps} ulps)"
        return (
            f"{where}, {divergence.quantity}: {_show(divergence.expected)} vs "
            f"{_show(divergence.received)}{ulps}"
        )
    return f"{where}, {divergence.quantity}: {divergence.expected} vs {divergence.received}"


def _show(value: dict[str, str] | None) -> str:
    if value is None:
        return "(missing)"
    return f"{value['value']} (0x{value['bits']} {value['dtype']})"
