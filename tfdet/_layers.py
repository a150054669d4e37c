"""Walking a Keras model's layer tree (Keras 3 and tf_keras alike).

Both Keras generations keep a private `_flatten_layers`, which is the only
walk that also sees layers held as attributes of subclassed models; `layers`
is the public fallback for anything else that looks like a container.
"""

from __future__ import annotations

from typing import Any


def children(layer: Any) -> list[Any]:
    """The layers directly inside `layer`, in the order Keras tracks them."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        try:
            return list(flatten(include_self=False, recursive=False))
        except TypeError:  # pragma: no cover - unusual Layer subclasses
            pass
    return list(getattr(layer, "layers", []) or [])


def descendants(model: Any) -> list[Any]:
    """Every layer inside `model`, nested ones included, each once."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        try:
            return list(flatten(include_self=False, recursive=True))
        except TypeError:  # pragma: no cover - unusual Layer subclasses
            pass
    found: list[Any] = []
    pending = children(model)
    while pending:
        layer = pending.pop(0)
        if all(layer is not seen for seen in found):
            found.append(layer)
            pending.extend(children(layer))
    return found
