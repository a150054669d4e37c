"""Registry of tfdet's patches: what exists, what is installed, how to undo it.

Each patch lives in its own module under `tfdet/patches/` and registers a
`Patch` here when `tfdet.patches` is imported. `tfdet.enable()` installs the
ones the running versions need; `restore()` undoes them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

_LOG = logging.getLogger("tfdet")


@dataclasses.dataclass(frozen=True)
class Patch:
    """A deterministic replacement for a piece of TensorFlow or Keras.

    Attributes:
        name: Short identifier used in `enable(patches=[...])` and profiles.
        summary: What it replaces and with what, one line.
        upstream: The upstream issue or source that the patch answers.
        needed: Returns whether the running versions need the patch.
        install: Installs the patch; must be safe to call twice.
        restore: Undoes `install`; must be safe when not installed.
    """

    name: str
    summary: str
    upstream: str
    needed: Callable[[], bool]
    install: Callable[[], None]
    restore: Callable[[], None]


_REGISTRY: dict[str, Patch] = {}
_INSTALLED: list[str] = []


def register(patch: Patch) -> Patch:
    """Adds `patch` to the registry (idempotent by name)."""
    _REGISTRY[patch.name] = patch
    return patch


def available() -> dict[str, Patch]:
    """Every known patch by name (imports `tfdet.patches`)."""
    import tfdet.patches  # noqa: F401  (modules register themselves)

    return dict(_REGISTRY)


def installed() -> tuple[str, ...]:
    """Names of the installed patches, sorted."""
    return tuple(sorted(_INSTALLED))


def resolve(selection: str | Iterable[str] | None | bool) -> list[str]:
    """Names that a `patches=` argument selects.

    Args:
        selection: "auto" (the patches the running versions need), None or
            False (none), or an iterable of patch names.

    Raises:
        ValueError: an unknown patch name or selection.
    """
    if selection is None or selection is False:
        return []
    patches = available()
    if selection == "auto" or selection is True:
        return sorted(name for name, patch in patches.items() if patch.needed())
    if isinstance(selection, str):
        raise ValueError(
            "Expected `patches` to be 'auto', None, or a list of patch names "
            f"from {sorted(patches)}. Received: patches={selection!r}"
        )
    names = list(selection)
    unknown = sorted(set(names) - set(patches))
    if unknown:
        raise ValueError(
            f"Expected `patches` names from {sorted(patches)}. "
            f"Received unknown: {unknown}"
        )
    return sorted(set(names))


def install(names: Iterable[str]) -> tuple[str, ...]:
    """Installs the named patches; returns every installed patch name."""
    patches = available()
    for name in names:
        if name in _INSTALLED:
            continue
        patches[name].install()
        _INSTALLED.append(name)
        _LOG.info("tfdet: installed patch %s (%s)", name, patches[name].summary)
    return installed()


def restore(names: Iterable[str] | None = None) -> None:
    """Undoes the named patches (all installed ones when None)."""
    for name in list(_INSTALLED if names is None else names):
        if name in _INSTALLED:
            _REGISTRY[name].restore()
            _INSTALLED.remove(name)
