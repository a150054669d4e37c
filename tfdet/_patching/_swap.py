"""Reversible replacement of attributes and registered gradients.

Every patch owns one `Swap` (`tfdet._patching._registry.Patch`): its `apply`
makes each replacement through it, which records the original first, and
`restore()` puts them back in reverse order, so a patch is undone exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _gradient_entry(op_type: str) -> dict[str, Any]:
    from tensorflow.python.framework import ops

    return ops._gradient_registry._registry[op_type]  # pylint: disable=protected-access


def registered_gradient(op_type: str) -> Callable[..., Any]:
    """The gradient function registered for `op_type` now."""
    return _gradient_entry(op_type)["type"]


class Swap:
    """The replacements one patch made, and how to undo them."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def active(self) -> bool:
        """Whether replacements are in place."""
        return bool(self._saved)

    @property
    def saved(self) -> tuple[tuple[Any, str, Any], ...]:
        """`(owner, name, original)` of each replacement, oldest first.

        `owner` is an object (an attribute was replaced) or a gradient
        registry entry (a dict; `name` is its key).
        """
        return tuple(self._saved)

    def attribute(self, owner: Any, name: str, replacement: Any) -> Any:
        """Sets `owner.name = replacement`; returns the original value."""
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, replacement)
        return original

    def gradient(
        self, op_type: str, replacement: Callable[..., Any]
    ) -> Callable[..., Any]:
        """Replaces the gradient function registered for `op_type`.

        TensorFlow refuses a second `RegisterGradient` for the same op, so the
        registry entry itself is edited (graph and eager backprop both look
        the function up there when they differentiate an op).

        Returns:
            The original gradient function, for the cases the patch defers.
        """
        entry = _gradient_entry(op_type)
        original = entry["type"]
        self._saved.append((entry, "type", original))
        entry["type"] = replacement
        return original

    def restore(self) -> None:
        """Puts every original back, newest first."""
        while self._saved:
            owner, name, original = self._saved.pop()
            if isinstance(owner, dict):
                owner[name] = original
            else:
                setattr(owner, name, original)
