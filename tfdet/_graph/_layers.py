"""Walking a Keras model's layer tree (Keras 3 and tf_keras alike).

Both Keras generations keep a private `_flatten_layers`, which is the only
walk that also sees layers held as attributes of subclassed models; `layers`
is the public fallback for anything else that looks like a container.
"""

from __future__ import annotations

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
