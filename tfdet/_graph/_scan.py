"""Finds the ops of a model's training step that are hazards on GPU.

`scan(built)` traces the model's real training step (forward, loss,
gradients, optimizer update, metric updates) into a graph, walks every node,
including those of nested and gradient functions in the function library,
matches each op against the hazard table (`tfdet._patching._hazards`) and attributes it
to the Keras layer, metric or optimizer whose name scope it was built in.
Tracing needs no GPU: op types and attributes are decided at trace time.
`tfdet scan` hides any GPU (`tfdet._pin._devices.hide_gpus`) before TensorFlow starts, so the
warm-up step runs on the CPU even on a GPU machine.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterator
from typing import Any

from tfdet._graph import _layers
from tfdet._patching import _hazards, _registry

_LOG = logging.getLogger("tfdet")

LAYER = "layer"
METRIC = "metric"
OPTIMIZER = "optimizer"
LOSS = "loss"
UNKNOWN = "unknown"

# Name scope the scan opens around each metric's update (Keras metrics do not
# always open one); '-' is valid in scopes but not in Keras names' defaults.
_METRIC_SCOPE = "tfdet_metric-"
_GRADIENT_SCOPES = ("gradient_tape", "gradients")
_UNIQUIFIED = re.compile(r"^(.*)_\d+$")
_BACKWARD = re.compile(r"__backward_(.+)_\d+_\d+$")


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the traced graph or of a function in its library."""

    op_type: str
    name: str
    function: str
    attrs: dict[str, Any]
    xla: bool


@dataclasses.dataclass(frozen=True)
class Finding:
    """A hazard op reached by the training step, grouped by where it comes from.

    Attributes:
        op_type: The op, e.g. "ResizeNearestNeighborGrad".
        behaviour: "raises", "host_fallback", "nondeterministic" or
            "xla_compile_error".
        device: Where it behaves so ("GPU" or "any").
        kind: "layer", "metric", "optimizer", "loss" or "unknown".
        source: The layer, metric or optimizer name (a scope path if unknown).
        source_type: Its class name, when known.
        gradient: Whether the op is in the backward pass.
        nodes: Names of the graph nodes (first few) that are this op.
        count: Number of such nodes.
        patch: The tfdet patch for this op, or None.
        patch_installed: Whether that patch is installed in this process.
        detail: What the op does under determinism.
        upstream: Upstream issue.
    """

    op_type: str
    behaviour: str
    device: str
    kind: str
    source: str
    source_type: str
    gradient: bool
    nodes: tuple[str, ...]
    count: int
    patch: str | None
    patch_installed: bool
    detail: str
    upstream: str


@dataclasses.dataclass(frozen=True)
class ScanReport:
    """What the scan checked and found.

    Attributes:
        target: The TARGET scanned.
        keras: "keras3" or "tf_keras".
        tensorflow_version: TensorFlow the table was matched against.
        enabled: Whether `tfdet.enable()` was in force during the trace.
        patches: Patches installed during the trace.
        ops_checked: Number of nodes walked (graph + every library function).
        functions: Number of library functions walked.
        op_types: Every op type seen, sorted.
        deterministic_ops: Op types seen that the table marks deterministic.
        findings: Hazards in the traced step (each remains on GPU).
        covered: Hazards an unpatched trace had that installed patches removed.
            Best effort: a nested `tf.function` keeps the gradient it was
            first traced with, so a hazard inside one may be missing here
            (it is still absent from `findings` when patched).
        xla_dropped: Keras turned off an explicit `jit_compile=True` under op
            determinism, and the step was traced for XLA to name why.
    """

    target: str
    keras: str
    tensorflow_version: str
    enabled: bool
    patches: tuple[str, ...]
    ops_checked: int
    functions: int
    op_types: tuple[str, ...]
    deterministic_ops: tuple[str, ...]
    findings: tuple[Finding, ...]
    covered: tuple[Finding, ...]
    xla_dropped: bool = False

    @property
    def clean(self) -> bool:
        """No hazard remains in the traced step."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["clean"] = self.clean
        return data


def _attr_value(value: Any) -> Any:
    field = value.WhichOneof("value")
    return None if field is None else getattr(value, field)


def _called_functions(attrs: Any) -> Iterator[str]:
    """Names of the functions a node calls (`f`, `body`, `then_branch`, ...)."""
    for value in attrs.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (func.name for func in value.list.func)


def walk(graph_def: Any, *, xla: bool = False) -> Iterator[Node]:
    """Every node of `graph_def` and of each function in its library.

    A node inside a library function is named with the scope of the node
    that calls the function (a `PartitionedCall`, `If`, `While` ... or a
    gradient call), so that it is attributed where it was built.

    Args:
        graph_def: A `GraphDef` (e.g. `concrete_fn.graph.as_graph_def()`).
        xla: Whether the top-level graph is XLA-compiled.
    """
    functions = {
        function.signature.name: function for function in graph_def.library.function
    }
    callers: dict[str, tuple[str, str]] = {}  # function -> (caller node, its function)
    for node in graph_def.node:
        for called in _called_functions(node.attr):
            callers.setdefault(called, (node.name, ""))
    for name, function in functions.items():
        for node in function.node_def:
            for called in _called_functions(node.attr):
                if called != name:
                    callers.setdefault(called, (node.name, name))
    # A nested function's gradient is called from an unscoped node; it is
    # attributed where its forward function was called, in the backward pass.
    for name in functions:
        backward = _BACKWARD.search(name)
        if backward is None:
            continue
        forward = re.compile(rf"__forward_{re.escape(backward.group(1))}_\d+$")
        for other, caller in list(callers.items()):
            if forward.search(other):
                callers[name] = (f"{_GRADIENT_SCOPES[0]}/{caller[0]}", caller[1])
                break
    # tf_keras registers a cuDNN twin of each LSTM/GRU function (and of its
    # gradient) for Grappler to swap in on a GPU: same `api_implements`.
    # Nothing calls a twin in the graph, so it is attributed where the
    # function it stands for is called, forward to forward, backward to
    # backward (after the step above has placed the backward ones).
    twins: dict[tuple[bytes, bool], list[str]] = collections.defaultdict(list)
    for name, function in functions.items():
        implements = function.attr.get("api_implements")
        if implements is not None:
            twins[implements.s, bool(_BACKWARD.search(name))].append(name)
    for twin_names in twins.values():
        called_twins = [name for name in twin_names if name in callers]
        if called_twins:
            for name in twin_names:
                callers.setdefault(name, callers[called_twins[0]])
    prefixes: dict[str, str] = {"": ""}

    def prefix(function_name: str, seen: frozenset[str] = frozenset()) -> str:
        if function_name not in prefixes:
            caller = callers.get(function_name)
            if caller is None or caller[1] in seen:
                prefixes[function_name] = ""
            else:
                outer = prefix(caller[1], seen | {function_name})
                prefixes[function_name] = f"{outer}{caller[0]}/"
        return prefixes[function_name]

    for node in graph_def.node:
        attrs = {key: _attr_value(value) for key, value in node.attr.items()}
        yield Node(node.op, node.name, "", attrs, xla)
    for name, function in functions.items():
        must_compile = function.attr.get("_XlaMustCompile")
        function_xla = xla or bool(must_compile is not None and must_compile.b)
        scope = prefix(name)
        for node in function.node_def:
            attrs = {key: _attr_value(value) for key, value in node.attr.items()}
            yield Node(node.op, scope + node.name, name, attrs, function_xla)


def _match(component: str, names: dict[str, Any]) -> Any:
    """The object named `component`, allowing TF's `_N` scope suffix."""
    if component in names:
        return names[component]
    found = _UNIQUIFIED.match(component)
    if found and found.group(1) in names:
        return names[found.group(1)]
    return None


class Attributor:
    """Maps node names to the Keras object whose name scope built them."""

    def __init__(self, model: Any, calls: _layers.CallRecord | None = None) -> None:
        self._model = model
        self._calls = calls
        self._paths = {key: path for key, (_, path) in _layers.paths(model).items()}
        optimizer = getattr(model, "optimizer", None)
        self._optimizer_names = {}
        if optimizer is not None:
            for candidate in (
                getattr(optimizer, "name", None),
                type(optimizer).__name__,
            ):
                if candidate:
                    self._optimizer_names[candidate] = optimizer
        self._metrics = {_scope_name(m.name): m for m in metric_objects(model)}

    def attribute(self, node_name: str) -> tuple[str, str, str, bool]:
        """`(kind, source, source_type, gradient)` for a node name."""
        parts = node_name.split("/")[:-1]
        gradient = any(part in _GRADIENT_SCOPES for part in parts)
        parts = [part for part in parts if part not in _GRADIENT_SCOPES]
        metric = None
        for part in parts:
            if part.startswith(_METRIC_SCOPE):
                metric = part[len(_METRIC_SCOPE) :]
        if metric is not None:
            obj = self._metrics.get(metric)
            return (
                METRIC,
                metric,
                type(obj).__name__ if obj is not None else "",
                gradient,
            )
        # The layer whose call built the node (recorded while tracing), else
        # the scope names matched against layer names (tf.compat.v1 graphs).
        called = self._calls.layer_for(parts) if self._calls is not None else None
        if called is not None:
            source = self._paths.get(id(called), called.name)
            return LAYER, source, type(called).__name__, gradient
        if parts and _match(parts[0], self._optimizer_names) is not None:
            optimizer = _match(parts[0], self._optimizer_names)
            return (
                OPTIMIZER,
                getattr(optimizer, "name", parts[0]),
                type(optimizer).__name__,
                gradient,
            )
        layer = self._layer(parts)
        if layer is not None:
            return LAYER, layer.name, type(layer).__name__, gradient
        if parts and "loss" in parts[0]:
            return LOSS, parts[0], "", gradient
        return UNKNOWN, "/".join(parts) or "(top level)", "", gradient

    def _layer(self, parts: list[str]) -> Any:
        """Innermost layer along the scope path, descending parent to child."""
        model = self._model
        index = 0
        if parts and _match(parts[0], {model.name: model}) is not None:
            index = 1
        current, found = model, None
        for part in parts[index:]:
            child = _match(
                part, {layer.name: layer for layer in _layers.children(current)}
            )
            if child is None:
                break
            current = found = child
        return found


def _scope_name(name: str) -> str:
    """`name` with characters that name scopes refuse replaced."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name))


def metric_objects(model: Any) -> list[Any]:
    """Every metric of a compiled model, containers and their members."""
    seen: list[Any] = []

    def visit(metric: Any) -> None:
        if any(metric is other for other in seen):
            return
        seen.append(metric)
        for inner in list(getattr(metric, "metrics", None) or []):
            if inner is not metric and hasattr(inner, "update_state"):
                visit(inner)

    for metric in list(getattr(model, "metrics", None) or []):
        visit(metric)
    return seen


@contextlib.contextmanager
def _metric_scopes(model: Any) -> Iterator[None]:
    """Opens a name scope named after each metric around its update."""
    import tensorflow as tf

    wrapped = []
    for metric in metric_objects(model):
        own = vars(metric).get("update_state", None)
        original = metric.update_state
        scope = _METRIC_SCOPE + _scope_name(metric.name)

        def update_state(
            *args: Any, _original: Any = original, _scope: str = scope, **kwargs: Any
        ) -> Any:
            with tf.name_scope(_scope):
                return _original(*args, **kwargs)

        object.__setattr__(metric, "update_state", update_state)
        wrapped.append((metric, own))
    try:
        yield
    finally:
        for metric, own in wrapped:
            if own is None:
                object.__delattr__(metric, "update_state")
            else:
                object.__setattr__(metric, "update_state", own)


@contextlib.contextmanager
def _as_if_on_gpu(model: Any) -> Iterator[None]:
    """Makes Keras 3 trace the layers it would run on a GPU.

    Keras 3 decides at trace time, by asking whether a GPU is visible,
    whether LSTM and GRU layers use cuDNN; on a CPU machine the scan would
    otherwise never see the ops a GPU runs. Nothing executes in the trace, so
    no GPU is needed. (tf_keras puts both implementations in the graph.)
    """
    from tfdet._patching import _swap
    from tfdet.patches import cudnn_rnn

    rnn = cudnn_rnn.keras3_rnn_module() if _keras_of(model) == "keras3" else None
    swap = _swap.Swap()
    if rnn is not None:
        swap.attribute(rnn, "_is_gpu_available", lambda: True)
    try:
        yield
    finally:
        swap.restore()


def _to_tensors(data: Any) -> Any:
    import tensorflow as tf

    if isinstance(data, dict):
        return {key: _to_tensors(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return tuple(_to_tensors(value) for value in data)
    return tf.convert_to_tensor(data)


def trace_train_step(
    model: Any,
    x: Any,
    y: Any,
    calls: _layers.CallRecord | None = None,
    xla: bool | None = None,
) -> tuple[Any, bool]:
    """Traces `model.train_step` on one batch into a graph.

    The model must already have run one step (so its optimizer and metric
    variables exist). Keras 3 and tf_keras both define `train_step(data)`;
    it is traced here in a fresh `tf.function`, so patches installed or
    restored since the model's own trace take effect.

    Args:
        calls: Filled with the layer whose call built each op, when given.
        xla: Trace the step for XLA (True) or not (False); None: as the
            model compiles it.

    Returns:
        `(graph_def, xla)`: the traced graph with its function library, and
        whether it was traced for XLA.
    """
    import tensorflow as tf

    if xla is None:
        xla = bool(getattr(model, "jit_compile", False))
    if not tf.executing_eagerly():
        # tf.compat.v1 graph mode (tf_keras): the train function is built in
        # the Keras graph when the model first trains.
        from tf_keras.src import backend

        return backend.get_graph().as_graph_def(), xla
    data = (_to_tensors(x), _to_tensors(y))
    with (
        _metric_scopes(model),
        _as_if_on_gpu(model),
        _layers.record_calls(model) as record,
    ):
        step = tf.function(model.train_step, jit_compile=xla or None)
        concrete = step.get_concrete_function(data)
    if calls is not None:
        calls.ops.update(record.ops)
        calls.scopes.update(record.scopes)
    return concrete.graph.as_graph_def(), xla


def find(
    graph_def: Any,
    model: Any,
    xla: bool,
    tensorflow_version: str,
    calls: _layers.CallRecord | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """Hazard findings in `graph_def`, plus statistics of what was walked.

    `calls` (from `trace_train_step`) attributes nodes to the layer whose
    call built them; without it, scope names are matched to layer names.
    """
    attributor = Attributor(model, calls)
    installed = set(_registry.installed())
    groups: dict[tuple, list[Node]] = collections.defaultdict(list)
    rows: dict[tuple, _hazards.Hazard] = {}
    op_types: set[str] = set()
    deterministic: set[str] = set()
    count = 0
    for node in walk(graph_def, xla=xla):
        count += 1
        op_types.add(node.op_type)
        row = _hazards.lookup(
            node.op_type,
            node.attrs,
            tensorflow_version=tensorflow_version,
            xla=node.xla,
        )
        if row is None:
            continue
        if row.behaviour == _hazards.DETERMINISTIC:
            deterministic.add(node.op_type)
        if not row.hazardous:
            continue
        kind, source, source_type, gradient = attributor.attribute(node.name)
        key = (node.op_type, kind, source, source_type, gradient)
        groups[key].append(node)
        rows[key] = row
    findings = []
    for key, nodes in sorted(groups.items()):
        op_type, kind, source, source_type, gradient = key
        row = rows[key]
        patch = _registry.covering(op_type)
        findings.append(
            Finding(
                op_type=op_type,
                behaviour=row.behaviour,
                device=row.device,
                kind=kind,
                source=source,
                source_type=source_type,
                gradient=gradient,
                nodes=tuple(node.name for node in nodes[:3]),
                count=len(nodes),
                patch=patch,
                patch_installed=patch in installed,
                detail=row.detail,
                upstream=row.upstream,
            )
        )
    stats = {
        "ops_checked": count,
        "functions": len(graph_def.library.function),
        "op_types": tuple(sorted(op_types)),
        "deterministic_ops": tuple(sorted(deterministic)),
    }
    return findings, stats


def _keras_of(model: Any) -> str:
    return "tf_keras" if type(model).__module__.startswith("tf_keras") else "keras3"


def _warm_up(built: Any) -> None:
    """Runs one real step so the optimizer and metric variables exist."""
    x, y = built.batch(0)
    built.model.train_on_batch(x, y)


def scan(
    built: Any,
    target: str,
    *,
    compare_unpatched: bool = True,
    xla_dropped: bool = False,
) -> ScanReport:
    """Scans a built TARGET's training step.

    Args:
        built: A `tfdet._target._load.Built`.
        target: The TARGET text, for the report.
        compare_unpatched: When patches are installed, also trace without them
            (restoring them afterwards) to report which hazards they cover.
        xla_dropped: Keras turned off the `jit_compile=True` the model asked
            for (op determinism): the step is traced for XLA anyway, so that
            the findings name what has no deterministic XLA form.

    Returns:
        The `ScanReport`.
    """
    import tensorflow as tf

    from tfdet._setup import _enable

    version = tf.__version__
    model = built.model
    _warm_up(built)
    x, y = built.batch(0)
    calls = _layers.CallRecord()
    graph_def, xla = trace_train_step(model, x, y, calls, xla=xla_dropped or None)
    findings, stats = find(graph_def, model, xla, version, calls)
    covered: list[Finding] = []
    installed = _registry.installed()
    if installed and compare_unpatched and tf.executing_eagerly():
        # Re-installing would log each patch again; the trace is internal.
        level = _LOG.level
        _LOG.setLevel(logging.WARNING)
        _registry.restore(installed)
        try:
            unpatched_calls = _layers.CallRecord()
            unpatched_def, _ = trace_train_step(model, x, y, unpatched_calls, xla)
            before, _ = find(unpatched_def, model, xla, version, unpatched_calls)
        finally:
            _registry.install(installed)
            _LOG.setLevel(level)
        remaining = {(f.op_type, f.kind, f.source, f.gradient) for f in findings}
        covered = [
            dataclasses.replace(f, patch_installed=True)
            for f in before
            if (f.op_type, f.kind, f.source, f.gradient) not in remaining
            and f.patch in installed
        ]
    _LOG.debug(
        "tfdet: scanned %d ops of %s, %d hazards",
        stats["ops_checked"],
        target,
        len(findings),
    )
    return ScanReport(
        target=target,
        keras=_keras_of(model),
        tensorflow_version=version,
        enabled=_enable.is_enabled(),
        patches=tuple(installed),
        findings=tuple(findings),
        covered=tuple(covered),
        xla_dropped=xla_dropped,
        **stats,
    )
