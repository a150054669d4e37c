"""Runs a callback when a module finishes importing (a one-shot import hook).

A patch of a library that is installed but not imported yet (tf_keras in a
Keras 3 script) is deferred with `when_imported()`: importing the library
just to patch it would cost its import time and module state in every
process, while waiting for its import keeps `tfdet.enable()` the same
whatever the script imports before or after it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable
from typing import Any


class _Loader(importlib.abc.Loader):
    """Delegates to the module's own loader, then runs the callback once."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader = loader
        self._hook = hook

    def __getattr__(self, attribute: str) -> Any:
        # get_source, get_resource_reader, is_package, ...: the real loader's.
        return getattr(self._loader, attribute)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # The module's own loader, for anything that inspects it later.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._hook.fire()


class Hook(importlib.abc.MetaPathFinder):
    """Calls `callback` right after module `name` is first imported."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback
        self._finding = False
        self._done = False

    @property
    def pending(self) -> bool:
        """Whether the callback has neither run nor been cancelled."""
        return not self._done

    def fire(self) -> None:
        """Runs the callback, once, unless the hook was removed."""
        if self._done:
            return
        self.remove()
        try:
            self.callback()
        except Exception as error:  # noqa: BLE001 - the import itself succeeded.
            warnings.warn(
                f"tfdet: the deferred patch for {self.name!r} failed to install "
                f"when {self.name} was imported: {error!r}",
                stacklevel=3,
            )

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._finding or self._done:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)  # The other finders.
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        # Only wrapped: `importlib.util.find_spec` also lands here without
        # importing, so the hook fires when the loader executes the module.
        spec.loader = _Loader(spec.loader, self)
        return spec

    def remove(self) -> None:
        """Cancels the hook (safe to call twice)."""
        self._done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, callback: Callable[[], None]) -> Hook | None:
    """Runs `callback` now if `name` is imported, else right after its import.

    Returns:
        The pending `Hook` (call `remove()` to cancel it), or None when the
        callback already ran.
    """
    if name in sys.modules:
        callback()
        return None
    hook = Hook(name, callback)
    sys.meta_path.insert(0, hook)
    return hook
