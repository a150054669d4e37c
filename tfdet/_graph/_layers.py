"""Walking a Keras model's layer tree (Keras 3 and tf_keras alike), and
recording which layer's call built each op of a trace.

Both Keras generations keep a private `_flatten_layers`, which is the only
walk that also sees layers held as attributes of subclassed models; `layers`
is the public fallback for anything else that looks like a container.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


def _flattened(layer: Any, *, recursive: bool) -> list[Any] | None:
    """Keras' own walk below `layer`, or None where it has none."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return None
    try:
        return list(flatten(include_self=False, recursive=recursive))
    except TypeError:  # pragma: no cover - unusual Layer subclasses
        return None


def children(layer: Any) -> list[Any]:
    """The layers directly inside `layer`, in the order Keras tracks them."""
    found = _flattened(layer, recursive=False)
    return found if found is not None else list(getattr(layer, "layers", []) or [])


def descendants(model: Any) -> list[Any]:
    """Every layer inside `model`, nested ones included, each once."""
    found = _flattened(model, recursive=True)
    if found is not None:
        return found
    found, seen = [], set()
    pending = children(model)
    while pending:
        layer = pending.pop(0)
        if id(layer) not in seen:
            seen.add(id(layer))
            found.append(layer)
            pending.extend(children(layer))
    return found


def paths(model: Any) -> dict[int, tuple[Any, str]]:
    """`id(layer) -> (layer, path)` for every layer inside `model`.

    A path is the layer names from the model down, joined with "/"
    ("bidirectional/forward_lstm"); a top-level layer's path is its name.
    """
    found: dict[int, tuple[Any, str]] = {}
    pending = [(child, child.name) for child in children(model)]
    while pending:
        layer, path = pending.pop(0)
        if id(layer) not in found:
            found[id(layer)] = (layer, path)
            pending.extend((c, f"{path}/{c.name}") for c in children(layer))
    return found


class CallRecord:
    """Which layer's call built each op of a traced graph.

    Filled by `record_calls`: `ops` maps an op's name to the innermost layer
    whose call was running when the op was created; `scopes` maps the name
    scope of those ops to that layer, for nodes named after them (gradients,
    nodes of called functions).
    """

    def __init__(self) -> None:
        self.ops: dict[str, Any] = {}
        self.scopes: dict[str, Any] = {}

    def layer_for(self, parts: list[str]) -> Any:
        """The layer for a node name split on "/", longest prefix first."""
        for end in range(len(parts), 0, -1):
            prefix = "/".join(parts[:end])
            layer = self.ops.get(prefix) or self.scopes.get(prefix)
            if layer is not None:
                return layer
        return None


@contextlib.contextmanager
def record_calls(model: Any) -> Iterator[CallRecord]:
    """Records, while tracing, which layer object's call built each op.

    Layer names can collide with the scopes TensorFlow uniquifies (a second
    `Bidirectional` is auto-named `bidirectional_1`, the scope TensorFlow
    gives the first one's second call): matching scope names to layer names
    would then blame the wrong layer. The `__call__` that Keras layers
    inherit is wrapped on the class that defines it (for the layers of
    `model` only; others pass through) and restored on exit.
    """
    import tensorflow as tf

    tracked = paths(model)
    record = CallRecord()
    originals: dict[type, Any] = {}
    for layer, _ in tracked.values():
        for cls in type(layer).__mro__:
            if "__call__" in vars(cls):
                originals.setdefault(cls, vars(cls)["__call__"])
                break

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if id(self) not in tracked:
                return original(self, *args, **kwargs)
            graph = tf.compat.v1.get_default_graph()
            before = len(graph.get_operations())
            try:
                return original(self, *args, **kwargs)
            finally:
                # Inner calls finish first and keep the ops they built.
                for op in graph.get_operations()[before:]:
                    if op.name not in record.ops:
                        record.ops[op.name] = self
                        record.scopes.setdefault(op.name.rpartition("/")[0], self)

        return __call__

    for cls, original in originals.items():
        setattr(cls, "__call__", wrap(original))  # noqa: B010
    try:
        yield record
    finally:
        for cls, original in originals.items():
            setattr(cls, "__call__", original)  # noqa: B010
