"""Registry of tfdet's patches: what exists, what is installed, how to undo it.

Each module under `tfdet/patches/` (other than the `_`-prefixed helpers)
declares one `Patch` as its `PATCH`, named like the module: the op types it
replaces, the upstream issue it answers, and the function that makes its
replacements. Everything else derives from those declarations: the registry
(found with `pkgutil` on first use, so no list of patches is kept anywhere),
whether the running versions need a patch (the hazard table's facts about
its ops, plus the patch's own Keras requirements), which patch covers a
hazardous op in `tfdet scan`, and the patches `tfdet.enable()` installs.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import logging
import pkgutil
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tfdet._kernels import library as kernel_library
from tfdet._kernels.library import KernelLibrary
from tfdet._patching import _hazards, _import_hook
from tfdet._patching._swap import Swap
from tfdet._pin import _devices, _versions

_LOG = logging.getLogger("tfdet")

# Every replacement op runs in a name scope that starts with one of these
# (`DeterministicDenseBincount`, `PoolSizeFreeMatMul`, `PortableErfc`), so
# that a graph or a profile tells tfdet's ops from the model's own.
SCOPE_PREFIXES = ("Deterministic", "PoolSizeFree", "Portable")

# The selection of the patches the running versions need.
AUTO = "auto"
# Before a name in a selection: leave that patch out (`["auto", "-fixed_order_add_n"]`).
WITHOUT = "-"

# The package whose public modules are the patches.
PACKAGE = "tfdet.patches"

# `requires` key naming the Keras that must be usable ("tf_keras" or "keras3").
KERAS_IN_USE = "keras_in_use"
# `requires` of a patch of Keras 3's own code (read-only: patches share it).
KERAS3 = types.MappingProxyType({"keras": ">=3.0", KERAS_IN_USE: "keras3"})

Apply = Callable[[Swap], None]


# Install order: two patches of one op stack (the later one calls the
# earlier one's replacement), so they are undone newest first.
_INSTALLS = itertools.count()


@dataclasses.dataclass
class _State:
    installed: bool = False
    order: int = -1
    hooks: list[_import_hook.Hook] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Patch:
    """A deterministic replacement for a piece of TensorFlow or Keras.

    Attributes:
        name: Identifier used in `enable(patches=[...])` and profiles; the
            name of the module under `tfdet/patches/` that declares it, which
            is where it comes from unless given (the module of `apply`, or of
            the first `after_import` function).
        replaces: TensorFlow op types the patch keeps out of the graph. The
            hazard table's rows for them decide the TensorFlow versions that
            need the patch, and `tfdet scan` names the patch for them. Empty
            (the default) for a patch that fixes Keras code or decides a
            `tf.distribute` setting rather than replacing an op.
        summary: What it replaces and with what, one line.
        upstream: The upstream issue or pull request the patch answers.
        apply: Makes the replacements now, recording each in the `Swap` it
            is given (so `restore()` can undo them), or None.
        after_import: `(module, apply)` pairs: `apply` runs once `module` is
            imported (now if it already is). A module that is not installed
            is skipped. For patches of a library a script may import later
            (tf_keras), without importing it just to patch it.
        requires: Further conditions for `needed()`: version specifiers of
            installed distributions (`{"tf_keras": ">=2.16"}`; "tensorflow"
            means whichever TensorFlow distribution is installed), and
            `keras_in_use` ("tf_keras": tf_keras is installed, whether or not
            imported yet or selected by `TF_USE_LEGACY_KERAS`, so the result
            does not depend on import order; "keras3": `tf.keras` is Keras 3).
        distribution: The `tf.distribute` settings the patch decides while
            installed, as the profile's `distribution` section records them
            (`{"collective": "RING"}`); empty for patches of single ops.
        unavailable: Says why the patch cannot work, or has nothing to do,
            in this process (None when it can), for a patch that needs more
            than versions (a platform, a symbol table, another patch's ops);
            `needed()` is False while it says why.
        opt_in: Installed only when named (`patches=["auto", name]`), never
            by "auto": a patch that buys a promise the default profile does
            not make, at a cost in speed.
        kernel: tfdet's compiled library that computes the patch's ops where
            it loads (a composition of TensorFlow's ops does where it does
            not); the profile's `kernels` records which. None for a patch
            of TensorFlow's ops only.
        cpu_only: Its ops are CPU ops (tfdet's kernels, or the compositions
            that stand in for them, which rely on oneDNN): with a GPU
            visible, "auto" leaves it out, since it would move a GPU
            model's products to the CPU; there op determinism gives the
            GPU's tier.
    """

    name: str = ""
    replaces: tuple[str, ...] = ()
    summary: str
    upstream: str
    apply: Apply | None = None
    after_import: tuple[tuple[str, Apply], ...] = ()
    requires: Mapping[str, str] = dataclasses.field(default_factory=dict)
    distribution: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unavailable: Callable[[], str | None] | None = None
    opt_in: bool = False
    kernel: KernelLibrary | None = None
    cpu_only: bool = False
    _swap: Swap = dataclasses.field(default_factory=Swap, init=False, repr=False)
    _state: _State = dataclasses.field(default_factory=_State, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            declared_by = self.apply or next(
                (apply for _, apply in self.after_import), None
            )
            if declared_by is None:
                raise ValueError(
                    "Expected a Patch with `name`, `apply` or `after_import`. "
                    "Received: none of them."
                )
            # Frozen: set once here, as the constructor would.
            object.__setattr__(self, "name", declared_by.__module__.rsplit(".", 1)[-1])

    @property
    def installed(self) -> bool:
        """Whether `install()` ran and `restore()` did not undo it since."""
        return self._state.installed

    def replaced(self) -> tuple[tuple[Any, str, Any], ...]:
        """`(owner, name, original)` of each replacement in force, oldest first."""
        return self._swap.saved

    def pending(self) -> bool:
        """Whether part of the patch waits for a module to be imported."""
        return any(hook.pending for hook in self._state.hooks)

    def needed(self) -> bool:
        """Whether the running versions need the patch.

        Needed when the installed TensorFlow has a hazardous row in the
        hazard table for one of `replaces`, and every `requires` holds. A
        patch that replaces no op (a fix of Keras itself) is needed when
        every `requires` holds.
        """
        found = _versions.tensorflow_distribution()
        if found is None:
            return False
        if self.replaces and not _hazards.needs_patch(self.replaces, found[1]):
            return False
        if self.unavailable is not None and self.unavailable() is not None:
            return False
        if self.cpu_only and _devices.gpu_visible():
            return False
        return all(_holds(key, wanted) for key, wanted in self.requires.items())

    def install(self) -> None:
        """Makes the replacements (those of `after_import` now or on import).

        Safe to call twice: the second call changes nothing.
        """
        if self._state.installed:
            return
        self._state.installed = True
        self._state.order = next(_INSTALLS)
        if self.apply is not None:
            self.apply(self._swap)
        for module, apply in self.after_import:
            if importlib.util.find_spec(module) is None:
                continue
            # The default binds this loop's `apply`; mypy cannot infer a
            # lambda with a parameter against `Callable[[], None]`.
            hook = _import_hook.when_imported(module, lambda a=apply: a(self._swap))  # type: ignore[misc]
            if hook is not None:
                self._state.hooks.append(hook)

    def restore(self) -> None:
        """Puts every original back and cancels waiting parts (safe twice)."""
        for hook in self._state.hooks:
            hook.remove()
        self._state.hooks.clear()
        self._swap.restore()
        self._state.installed = False


def cpu_only_names() -> list[str]:
    """The patches whose ops run on the CPU only (see `Patch.cpu_only`)."""
    return [name for name, patch in available().items() if patch.cpu_only]


def _tf_keras_importable() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def _holds(key: str, wanted: str) -> bool:
    """Whether one `requires` entry holds in this process."""
    if key == KERAS_IN_USE:
        if wanted == "tf_keras":
            # Whether tf_keras *can* be used, not whether it was imported
            # yet: deciding by `sys.modules` made the installed patches
            # depend on import order. Its patches wait for its import.
            return _tf_keras_importable()
        return not _versions.uses_legacy_keras()
    if key == "tensorflow":  # Whichever distribution (tensorflow-cpu, ...).
        found = _versions.tensorflow_distribution()
        version = found[1] if found else None
    else:
        version = _versions.distribution_version(key)
    return version is not None and _hazards.version_matches(version, wanted)


_REGISTRY: dict[str, Patch] = {}


def _discover() -> dict[str, Patch]:
    package = importlib.import_module(PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        patch = getattr(module, "PATCH", None)
        if not isinstance(patch, Patch) or patch.name != info.name:
            raise TypeError(
                f"Expected module {module.__name__} to declare "
                f"`PATCH = Patch(name={info.name!r}, ...)`. "
                f"Received: PATCH={patch!r}. Prefix helper modules with '_'."
            )
        found[patch.name] = patch
    return dict(sorted(found.items()))


def available() -> dict[str, Patch]:
    """Every patch by name, sorted (imports the patch modules on first use)."""
    if not _REGISTRY:
        _REGISTRY.update(_discover())
    return dict(_REGISTRY)


def covering(op_type: str) -> str | None:
    """Name of the patch that replaces `op_type`, or None."""
    for name, patch in available().items():
        if op_type in patch.replaces:
            return name
    return None


def installed() -> tuple[str, ...]:
    """Names of the installed patches, sorted."""
    return tuple(name for name, patch in available().items() if patch.installed)


def kernel_origins(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`(library, origin)` for each library that the named patches loaded:
    shipped with a wheel, built at install, or from the cache; sorted."""
    patches = available()
    # mypy does not narrow `patches[name].kernel` by the `is not None` test
    # beside it, nor knows that a loaded library's origin is set (`build()`).
    return tuple(
        sorted(
            {
                (patches[name].kernel.name, patches[name].kernel.origin())  # type: ignore[misc, union-attr]
                for name in names
                if patches[name].kernel is not None and patches[name].kernel.loaded()  # type: ignore[union-attr]
            }
        )
    )


def on_kernels(names: Iterable[str]) -> tuple[str, ...]:
    """Those of the named patches whose compiled kernel loaded, sorted."""
    patches = available()
    # mypy does not narrow `patches[name].kernel` by the `is not None` test.
    return tuple(
        sorted(
            name
            for name in names
            if patches[name].kernel is not None and patches[name].kernel.loaded()  # type: ignore[union-attr]
        )
    )


def resolve(selection: str | Iterable[str] | None | bool) -> list[str]:
    """Names that a `patches=` argument selects.

    Args:
        selection: "auto" (the patches the running versions need, opt-in
            ones excepted), None or False (none), or an iterable of patch
            names, which may include "auto" (`["auto", "cudnn_rnn"]`), and
            names after "-" to leave out (`["auto", "-portable_kernels"]`).

    Raises:
        ValueError: an unknown patch name or selection.
    """
    if selection is None or selection is False:
        return []
    patches = available()
    if selection == AUTO or selection is True:
        return [
            name
            for name, patch in patches.items()
            if patch.needed() and not patch.opt_in
        ]
    if isinstance(selection, str):
        raise ValueError(
            "Expected `patches` to be 'auto', None, or a list of patch names "
            f"from {sorted(patches)}. Received: patches={selection!r}"
        )
    names = list(selection)
    left_out = {name[len(WITHOUT) :] for name in names if name.startswith(WITHOUT)}
    names = [name for name in names if not name.startswith(WITHOUT)]
    if AUTO in names:
        names = [name for name in names if name != AUTO] + resolve(AUTO)
    unknown = sorted((set(names) | left_out) - set(patches))
    if unknown:
        raise ValueError(
            f"Expected `patches` names from {sorted(patches)} (each may follow "
            f"{WITHOUT!r} to leave it out). Received unknown: {unknown}"
        )
    return sorted(set(names) - left_out)


def install(names: Iterable[str]) -> tuple[str, ...]:
    """Installs the named patches; returns every installed patch name.

    The compiled kernels of those not installed yet are built first, side
    by side, so that each patch then loads its own from the cache.
    """
    patches = available()
    names = list(names)
    # mypy does not narrow `patches[name].kernel` by the `is not None` test.
    kernel_library.build_together(
        patches[name].kernel  # type: ignore[misc]
        for name in names
        if patches[name].kernel is not None and not patches[name].installed
    )
    for name in names:
        if not patches[name].installed:
            patches[name].install()
            _LOG.info("tfdet: installed patch %s (%s)", name, patches[name].summary)
    return installed()


def restore(names: Iterable[str] | None = None) -> None:
    """Undoes the named patches (all installed ones when None).

    Patches installed after the oldest named one are undone too, newest
    first, and those not named installed again: a patch stacked on a named
    one's replacement would otherwise put that replacement back.
    """
    patches = available()
    named = set(installed() if names is None else names)
    newest_first = sorted(
        (patch for patch in patches.values() if patch.installed),
        key=lambda patch: patch._state.order,
        reverse=True,
    )
    oldest_named = min(
        (patch._state.order for patch in newest_first if patch.name in named),
        default=None,
    )
    if oldest_named is None:
        return
    undone = [patch for patch in newest_first if patch._state.order >= oldest_named]
    for patch in undone:
        patch.restore()
    for patch in reversed(undone):
        if patch.name not in named:
            patch.install()
