"""Child side of `tfdet locate`: train a TARGET, fingerprint every layer.

Runs in a fresh, perturbed process started by `tfdet._child._start` (kind
`locate`; it starts as the check child does, `tfdet._child._worker.start`). Each
step is one `tf.function` with a `tf.GradientTape`; every layer's `call` is
wrapped so that, while the step is traced, its outputs are collected in
execution order. The step returns those outputs, the gradient of the loss
with respect to each of them and to each trainable variable, and the
fingerprints of all of them are taken on the device with
`_bits.device_checksums` (8 bytes per tensor reach the host).

The result file lists the layers in execution order with the TensorFlow op
types inside each (from the traced graph's name scopes) and, per step, the
fingerprints in the order they were computed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from tfdet._graph import _layers
from tfdet._protocol._spec import WorkerSpec
from tfdet._record import _layer_walk, _trace
from tfdet._target import _feeding

_PLUMBING_OPS = frozenset(
    {"Placeholder", "Const", "NoOp", "Identity", "IdentityN", "ReadVariableOp"}
)


class _LayerOutputs:
    """Wraps each layer's `call` to collect its outputs while tracing."""

    def __init__(self, model: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.tensors: list[Any] = []
        self.model_outputs: list[Any] = []
        self._step_graph: Any = None  # The traced step's graph (`reset`).
        for layer in _layers.descendants(model):
            self._wrap(layer)

    def _wrap(self, layer: Any) -> None:
        import tensorflow as tf

        original: Callable[..., Any] = layer.call

        def call(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            if tf.compat.v1.get_default_graph() is not self._step_graph:
                # Called inside a loop's body (an LSTM's or GRU's cell, once
                # per time step): its outputs cannot leave that graph. The
                # layer that runs the loop is recorded instead.
                return outputs
            flat = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
            inputs = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
            self.calls.append(
                {
                    "name": layer.name,
                    "class": type(layer).__name__,
                    # Keras opens the layer's name scope around `call`; the
                    # graph's op names start with it.
                    "scope": tf.get_current_name_scope(),
                    "outputs": len(flat),
                    "output_tensors": flat,
                    "input_tensors": inputs,
                    "layer": layer,
                }
            )
            self.tensors.extend(flat)
            return outputs

        # An instance attribute: Keras's `__call__` looks `call` up on the
        # instance, and the class (shared with other models) stays untouched.
        layer.call = call

    def reset(self) -> None:
        """Starts a trace of the step: called first inside the traced step."""
        import tensorflow as tf

        self.calls.clear()
        self.tensors.clear()
        self.model_outputs = []
        self._step_graph = tf.compat.v1.get_default_graph()

    def consumers(self) -> list[list[int]]:
        """Per call, the calls that take one of its outputs as an input.

        A container (a nested model or block) and the layer inside it that
        does the work may both take the same tensor: only the innermost
        consumers are kept, the ones whose backward pass computes the
        gradient.
        """
        result = []
        for producer in self.calls:
            found = [
                index
                for index, call in enumerate(self.calls)
                if call is not producer
                and any(
                    t is o
                    for t in call["input_tensors"]
                    for o in producer["output_tensors"]
                )
            ]
            inner = {
                index
                for index in found
                for other in found
                if other != index
                and _contains(self.calls[index]["layer"], self.calls[other]["layer"])
            }
            result.append([index for index in found if index not in inner])
        return result

    def feeds_model_output(self) -> list[bool]:
        """Per call, whether one of its outputs is an output of the model."""
        return [
            any(t is o for t in call["output_tensors"] for o in self.model_outputs)
            for call in self.calls
        ]


def _contains(container: Any, layer: Any) -> bool:
    return container is not layer and any(
        inner is layer for inner in _layers.descendants(container)
    )


def _owner(variable: Any, calls: list[dict[str, Any]]) -> int | None:
    """Index of the innermost called layer that holds `variable`."""
    best, best_size = None, None
    for index, call in enumerate(calls):
        weights = call["layer"].trainable_weights
        holds = any(w is variable for w in weights)
        if holds and (best_size is None or len(weights) < best_size):
            best, best_size = index, len(weights)
    return best


def _ops_by_scope(graph: Any, scope: str) -> tuple[list[str], list[str]]:
    """Op types under `scope` in the forward and in the gradient part."""
    forward: list[str] = []
    backward: list[str] = []
    prefix = scope + "/"
    gradient_prefix = "gradient_tape/" + prefix
    for op in graph.get_operations():
        if op.type in _PLUMBING_OPS:
            continue
        if op.name.startswith(prefix) and op.type not in forward:
            forward.append(op.type)
        elif op.name.startswith(gradient_prefix) and op.type not in backward:
            backward.append(op.type)
    return forward, backward


def _fingerprints(tensors: list[Any]) -> list[str]:
    """One fingerprint per tensor; "none" for a missing gradient."""
    from tfdet._record import _bits

    present = [index for index, t in enumerate(tensors) if t is not None]
    sums = (
        _bits.checksum_hex(_bits.device_checksums([tensors[i] for i in present]))
        if present
        else []
    )
    result = ["none"] * len(tensors)
    for index, value in zip(present, sums, strict=True):
        result[index] = value
    return result


def _build_model(model: Any, x: Any) -> None:
    if not getattr(model, "built", False):
        # A subclassed model creates its weights on its first call.
        model(x, training=False)
    optimizer = model.optimizer
    build = getattr(optimizer, "build", None)
    if callable(build) and not getattr(optimizer, "built", False):
        # Legacy optimizers create their slots on first use instead.
        with contextlib.suppress(TypeError):
            build(model.trainable_variables)


def _train_step(model: Any, recorder: _LayerOutputs, variables: list[Any]) -> Any:
    """A `tf.function` training step that returns what the recorder saw.

    Returns `(loss, layer outputs, gradients reaching them, variable
    gradients)`, after applying the variable gradients as `fit` would.
    """
    import tensorflow as tf

    @tf.function
    def train_step(x: Any, y: Any) -> tuple[Any, ...]:
        recorder.reset()
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            recorder.model_outputs = tf.nest.flatten(y_pred)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        outputs = list(recorder.tensors)
        gradients = tape.gradient(loss, variables + outputs)
        variable_grads = gradients[: len(variables)]
        model.optimizer.apply_gradients(
            [
                (g, v)
                for g, v in zip(variable_grads, variables, strict=True)
                if g is not None
            ]
        )
        return loss, outputs, gradients[len(variables) :], variable_grads

    return train_step


def _layer_records(graph: Any, recorder: _LayerOutputs) -> list[dict[str, Any]]:
    """One record per recorded layer call: its tensors, op types and consumers."""
    layers = []
    position = 0
    consumers = recorder.consumers()
    feeds_output = recorder.feeds_model_output()
    for index, call in enumerate(recorder.calls):
        forward, backward = _ops_by_scope(graph, call["scope"])
        layers.append(
            {
                "name": call["name"],
                "class": call["class"],
                "scope": call["scope"],
                "tensors": [position, position + call["outputs"]],
                "ops": forward,
                "gradient_ops": backward,
                # Who computes the gradient arriving at this layer's output.
                "consumers": consumers[index],
                "model_output": feeds_output[index],
            }
        )
        position += call["outputs"]
    return layers


def run(spec: WorkerSpec) -> None:
    """Trains `spec.target` for `spec.steps` steps, fingerprinting layers.

    With `spec.record`, also writes the fingerprints as a trace as the steps
    run (`tfdet locate --record`).
    """
    from tfdet._child import _start, _worker
    from tfdet._errors import TargetError
    from tfdet._record import _bits

    started = time.perf_counter()
    built = _worker.start(spec)
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise TargetError(
            f"Expected TARGET {spec.target!r} to train eagerly (TensorFlow 2 "
            "behaviour). Received: a model built after `disable_eager_execution()`; "
            "`tfdet locate` records layers in a `tf.function` step. Use `tfdet "
            "check` for tf.compat.v1 graph-mode targets."
        )
    model = built.model
    custom = _feeding.custom_train_step(model)
    if custom is not None:
        raise TargetError(
            f"Expected TARGET {spec.target!r} to train with Keras's own train_step. "
            f"Received: {custom} overrides train_step. `tfdet locate` replays "
            "Keras's step with a GradientTape to watch every layer, so it would "
            "not train what your model trains. Use `tfdet check`, which trains "
            "through train_on_batch (your train_step)."
        )
    first_x, first_y = built.batch(0)
    _build_model(model, first_x)
    recorder = _LayerOutputs(model)
    variables = list(model.trainable_variables)

    train_step = _train_step(model, recorder, variables)
    names = _bits.variable_names(variables)
    steps: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] | None = None
    owners: list[int | None] = []
    writer = None
    try:
        for step in range(spec.steps):
            x, y = built.batch(step)
            loss, outputs, output_grads, variable_grads = train_step(x, y)
            variable_grads = [
                tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                for g in variable_grads
            ]
            checksums = _bits.device_checksums(variables)
            steps.append(
                {
                    "step": step,
                    "outputs": _fingerprints(outputs),
                    "loss": _bits.value_bits(loss.numpy()),
                    "output_gradients": _fingerprints(output_grads),
                    "gradients": _fingerprints(variable_grads),
                    "weights": _bits.checksum_hex(checksums),
                }
            )
            if layers is None:  # The step function was traced by this step.
                graph = train_step.get_concrete_function(first_x, first_y).graph
                layers = _layer_records(graph, recorder)
                owners = [_owner(v, recorder.calls) for v in variables]
                if spec.record:
                    writer = _trace.TraceWriter(
                        spec.record, _record_header(spec, layers, names, owners)
                    )
            if writer is not None:
                writer.write_step(
                    _layer_walk.trace_step(
                        steps[-1], _trace.weights_fingerprint(checksums)
                    )
                )
            _start.report_progress(step + 1, spec.steps)
    finally:
        if writer is not None:
            writer.close()

    _start.write_result(
        {
            **_start.run_facts(spec),
            "layers": layers,
            "variables": names,
            "variable_layers": owners,
            "steps": steps,
            "seconds": time.perf_counter() - started,
        }
    )


def _record_header(
    spec: WorkerSpec,
    layers: list[dict[str, Any]],
    names: list[str],
    owners: list[int | None],
) -> dict[str, Any]:
    """The header of a `tfdet locate --record` trace: the usual facts + layers."""
    from tfdet._pin import _environment
    from tfdet._setup import _enable

    return _trace.make_header(
        _enable.observed_profile(spec.seed),
        _environment.fingerprint(_enable.profile()),
        names,
        training="locate",
        target=spec.target,
        layers=layers,
        variable_layers=owners,
    )
