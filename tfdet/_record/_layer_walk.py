"""Where two per-layer records of the same training first differ.

`tfdet locate`'s worker fingerprints, at every step, each layer's forward
output, the loss, the gradient reaching each layer's output, each variable's
gradient and each variable after the update. Two such records (two processes
of `tfdet locate`, or two trace files of `tfdet locate --record` from two
machines) are walked here in the order TensorFlow computes those quantities:
forward outputs in call order, the loss, then backward, layers in reverse
call order, each with its variables' gradients and the gradient it passes to
its input, then the optimizer's update. The first difference on that walk
names the layer where the bits part; the layers before it agree bit for bit.

A record is a run's `LocateResult`: `layers` (name, class, scope, `tensors`
span, `ops`, `gradient_ops`, `consumers`, `model_output`), `variables`
(names), `variable_layers` (the layer owning each variable) and `steps`,
each with `step`, `outputs`, `loss`, `output_gradients`, `gradients` and
`weights` (one fingerprint per variable).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

from tfdet._errors import RunFailedError
from tfdet._protocol import _result, _spec
from tfdet._protocol._result import LocateResult

# Phases of a training step, in the order they run.
FORWARD = "forward"
LOSS = "loss"
BACKWARD = "backward"
UPDATE = "update"


@dataclasses.dataclass(frozen=True)
class Location:
    """Where two runs' bits part.

    Attributes:
        step: First step (0-based) where any fingerprint differs.
        phase: `"forward"`, `"loss"`, `"backward"` or `"update"`.
        layer: Name of the layer, or None for the loss.
        layer_class: Its Python class name.
        scope: Its TensorFlow name scope in the traced step.
        quantity: What differs: `"output"`, `"input gradient"` (the gradient
            this layer's backward pass sends to its input, the only consumer
            of that input), `"gradient of VARIABLE"`, `"update of VARIABLE"`,
            `"loss"`, `"loss gradient"`, or, with `layer` None, the gradient
            flowing into a layer's output when several layers consume it.
        ops: TensorFlow op types of the layer's forward computation.
        gradient_ops: Op types of its gradient computation.
        agreeing: Layers before it, on the walk, whose bits agree.
    """

    step: int
    phase: str
    layer: str | None
    layer_class: str | None
    scope: str | None
    quantity: str
    ops: tuple[str, ...] = ()
    gradient_ops: tuple[str, ...] = ()
    agreeing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("ops", "gradient_ops", "agreeing"):
            data[key] = list(data[key])
        return data

    def describe(self) -> str:
        if self.layer is None:
            return f"step {self.step}, {self.phase}: the {self.quantity} differs"
        return (
            f"step {self.step}, {self.phase}: {self.quantity} of layer "
            f"{self.layer!r} ({self.layer_class})"
        )


def _slice(values: list[str], span: list[int]) -> list[str]:
    return values[span[0] : span[1]]


def _walk(
    result: LocateResult, step_a: dict[str, Any], step_b: dict[str, Any]
) -> Location | None:
    """The first differing quantity of one step, in execution order."""
    layers = result.layers
    names = result.variables
    owners = result.variable_layers
    step = int(step_a["step"])
    agreeing: list[str] = []

    def at(index: int | None, phase: str, quantity: str) -> Location:
        if index is None:
            return Location(
                step, phase, None, None, None, quantity, agreeing=tuple(agreeing)
            )
        layer = layers[index]
        return Location(
            step,
            phase,
            layer["name"],
            layer["class"],
            layer["scope"],
            quantity,
            tuple(layer["ops"]),
            tuple(layer["gradient_ops"]),
            tuple(agreeing),
        )

    for index, layer in enumerate(layers):
        span = layer["tensors"]
        if _slice(step_a["outputs"], span) != _slice(step_b["outputs"], span):
            return at(index, FORWARD, "output")
        agreeing.append(layer["name"])
    if step_a["loss"]["bits"] != step_b["loss"]["bits"]:
        return at(None, LOSS, "loss")
    for index in reversed(range(len(layers))):
        span = layers[index]["tensors"]
        if _slice(step_a["output_gradients"], span) != _slice(
            step_b["output_gradients"], span
        ):
            return _output_gradient(layers, index, at)
        mine = [v for v, owner in enumerate(owners) if owner == index]
        for v in mine:
            if step_a["gradients"][v] != step_b["gradients"][v]:
                return at(index, BACKWARD, f"gradient of {names[v]}")
        agreeing.append(f"{layers[index]['name']} (gradient)")
    for v, (a, b) in enumerate(
        zip(step_a["gradients"], step_b["gradients"], strict=True)
    ):
        if a != b:  # A variable no called layer owns.
            return at(owners[v], BACKWARD, f"gradient of {names[v]}")
    for v, (a, b) in enumerate(zip(step_a["weights"], step_b["weights"], strict=True)):
        if a != b:
            return at(owners[v], UPDATE, f"update of {names[v]}")
    return None


def _output_gradient(
    layers: Sequence[dict[str, Any]],
    index: int,
    at: Callable[[int | None, str, str], Location],
) -> Location:
    """Blame for a differing gradient arriving at layer `index`'s output.

    That gradient is computed by the backward pass of the layers consuming
    the output (the worker records them: `consumers`), or by the loss when
    the output is the model's. Their own outputs' gradients agree (the walk
    checked them first), so one of them is where the bits part. With several
    consumers (a residual or branched model) the sum cannot be split: the
    location names them all, without picking one.
    """
    name = layers[index]["name"]
    consumers = layers[index].get("consumers")
    if consumers is not None and len(consumers) == 1:
        return at(consumers[0], BACKWARD, "input gradient")
    if consumers == [] and layers[index].get("model_output"):
        return at(None, BACKWARD, "loss gradient")
    if consumers:
        names = ", ".join(repr(layers[c]["name"]) for c in consumers)
        return at(
            None,
            BACKWARD,
            f"gradient flowing into the output of {name!r}, summed from its "
            f"consumers {names}",
        )
    return at(
        None,
        BACKWARD,
        f"gradient flowing into the output of {name!r} (computed by the "
        "layers that consume it)",
    )


def locate_results(a: LocateResult, b: LocateResult) -> Location | None:
    """Where the layer records of two runs first differ, or None.

    Raises:
        RunFailedError: the runs traced different layer structures.
    """
    structure_a = [(layer["name"], layer["tensors"]) for layer in a.layers]
    structure_b = [(layer["name"], layer["tensors"]) for layer in b.layers]
    if structure_a != structure_b or a.variables != b.variables:
        raise RunFailedError(
            "Expected both runs to trace the same layers and variables. Received "
            f"different structures: {structure_a} vs {structure_b}. Does TARGET "
            "build a different model in each process?"
        )
    for step_a, step_b in zip(a.steps, b.steps, strict=False):
        found = _walk(a, step_a, step_b)
        if found is not None:
            return found
    return None


# The per-layer quantities a step of a `tfdet locate --record` trace adds to
# the usual step record.
LAYER_QUANTITIES = ("outputs", "output_gradients", "gradients")


def trace_step(step: dict[str, Any], weights_fingerprint: str) -> dict[str, Any]:
    """A step of a locate record as a trace line (`tfdet diff` reads both).

    The usual step record (loss, no metrics: the locate step computes none,
    the weights' fingerprint and per-variable `variables`) plus the layer
    quantities.
    """
    return {
        "epoch": 0,
        "step": step["step"],
        "batch": step["step"],
        "loss": step["loss"],
        "metrics": {},
        "weights": weights_fingerprint,
        "variables": step["weights"],
        **{key: step[key] for key in LAYER_QUANTITIES},
    }


def from_trace(
    header: dict[str, Any], steps: list[dict[str, Any]]
) -> LocateResult | None:
    """The layer record a `tfdet locate --record` trace holds, or None.

    The same record as a `tfdet locate` run's result, so that two recorded
    traces are walked as two runs are. None for traces without per-layer
    records (the callback's, `check`'s).
    """
    if not isinstance(header.get("layers"), list):
        return None
    result = _result.read(
        _spec.LOCATE,
        {
            "profile": header.get("profile") or {},
            "layers": header["layers"],
            "variables": header.get("variables", []),
            "variable_layers": header.get("variable_layers", []),
            "steps": [
                {
                    "step": step["step"],
                    "loss": step.get("loss"),
                    "weights": step.get("variables", []),
                    **{key: step.get(key, []) for key in LAYER_QUANTITIES},
                }
                for step in steps
            ],
        },
    )
    # `read` answers a LOCATE record with a `LocateResult` (its `_RECORDS`).
    return cast(LocateResult, result)
