"""tfdet's own TensorFlow ops: shipped with tfdet, else built once and cached.

Each library (`KernelLibrary`) is a TensorFlow custom op, one C++ source of
`src/`, bound to the TensorFlow minor it was built against. A process takes
the first of:

1. the library shipped with tfdet for the running TensorFlow's minor and
   this machine (`lib/tf2.21-x86_64/`, see `build`): built for a wheel
   ("wheel") or at a source install ("install"), never in a training
   process; used where its manifest names these very sources and flags
   and its SHA-256 is the one recorded;
2. the cache ("cache"): `TFDET_KERNEL_CACHE`, else
   `$XDG_CACHE_HOME/tfdet/kernels` (`~/.cache/tfdet/kernels`), keyed by what
   the library's code depends on (the TensorFlow build, the CPU
   architecture, the source and the flags, not where TensorFlow is
   installed nor the compiler), built there at first use with the C++
   compiler `CXX` (else g++ or c++) against `tf.sysconfig`'s flags, under a
   file lock and moved into place atomically, so parallel processes build
   it once. For what is not shipped: a TensorFlow newer than tfdet's
   table, a checkout under development;
3. nowhere: `load()` returns None and says why once, and the caller
   computes the same thing as a composition of TensorFlow's ops.

While a model is exported (`exporting()`), `load()` returns None too, so
that what is traced then is the compositions: a SavedModel of TensorFlow's
own ops, which a process without tfdet loads. So it does while a function
compiled by XLA (`jit_compile=True`) is traced: XLA compiles TensorFlow's
ops, not custom ones ("tf2xla conversion failed").

The compiler is left out of every key because the sources fix their own
arithmetic: no `-ffast-math`, no contraction of the code's multiplications
and additions, the kernels' FMAs written as intrinsics, so a conforming
compiler gives the same bits (the tests compare a shipped build with one
built here).

A library is loaded only when it is whole: every build records its SHA-256
beside it (`NAME.so.sha256`), and one whose digest is missing or differs (a
copy cut short, a full disk) is not loaded (`tf.load_op_library` on a
truncated file kills the process with SIGBUS): a cached one is built again
where a compiler is found, and refused with a message where none is.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import platform
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tfdet import _user_cache
from tfdet._kernels import build as _build

_LOG = logging.getLogger("tfdet")

# Where the built libraries are kept (a directory); the tests share one build.
CACHE_VARIABLE = "TFDET_KERNEL_CACHE"
# Where a library came from (`KernelLibrary.origin()`): shipped with a wheel,
# built at a source install, or found in (or built into) the cache.
ORIGINS = ("wheel", "install", "cache")


def cache_dir() -> Path:
    """The directory that holds built kernels (created on build)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    return _user_cache.directory() / "kernels"


def compiler() -> str | None:
    """The C++ compiler tfdet builds with (`CXX`, else g++ or c++), or None."""
    return _build.find_compiler()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _tensorflow_version() -> str:
    """The installed TensorFlow's version, from its metadata where it can
    (no import: `tfdet cost`'s parent process asks without TensorFlow)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is not None and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        found = _build.find_tensorflow(package.parent)
        if found is not None:
            return found[0]
    import tensorflow as tf

    return tf.__version__


# How many exports are tracing now: while any is, every library is out of
# reach and the callers trace their compositions. A count for the process,
# not per thread: another thread's step then takes the compositions too.
_EXPORTS = [0]


@contextlib.contextmanager
def exporting() -> Iterator[None]:
    """While it lasts, `KernelLibrary.load()` returns None (see the module)."""
    _EXPORTS[0] += 1
    try:
        yield
    finally:
        _EXPORTS[0] -= 1


def tracing_for_xla() -> bool:
    """Whether the graph being built now is compiled by XLA (TensorFlow's
    own test, as its ops use it to choose an XLA-friendly path)."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


class KernelLibrary:
    """One C++ source of tfdet's ops, found or built, and loaded once a process.

    Args:
        source: The `.cc` file; its stem names the library (and its flags,
            `build.OWN_FLAGS`).
        fallback: What the callers do where it cannot be had, for the one
            warning (e.g. "products use the composition instead").
        register: Called with `tensorflow` once the library loaded (its
            ops' gradients: TensorFlow refuses a second registration).
        unusable: Says why this CPU cannot run the library (an instruction
            set it is compiled for and the CPU lacks), or None: then it is
            not loaded, as where it cannot be built.
    """

    def __init__(
        self,
        source: Path,
        fallback: str,
        register: Callable[[Any], None] | None = None,
        unusable: Callable[[], str | None] | None = None,
    ) -> None:
        self.source = source
        self.name = source.stem
        self._fallback = fallback
        self._register = register
        self._unusable = unusable
        # "library": what load() gave (None: unavailable); "failure": the
        # error a build raised (kept, so the compiler runs once a process);
        # "origin": where build() found the library.
        self._state: dict[str, Any] = {}

    def shipped(self) -> tuple[Path, str] | None:
        """The library shipped for the running TensorFlow's minor and this
        machine, and its origin ("wheel" or "install"); None where none is
        shipped, or it was built from other sources or flags (a checkout
        edited since), or it is damaged (said once, as a warning)."""
        directory = _build.shipped_directory(_tensorflow_version())
        manifest = _build.read_manifest(directory)
        if manifest is None or manifest.get("origin") not in ORIGINS:
            return None
        if manifest.get("sources", {}).get(self.name) != _build.source_key(self.source):
            return None
        target = directory / f"{self.name}.so"
        damaged = _build.damage(target) if target.exists() else "it is missing"
        if damaged is not None:
            if "shipped_damage" not in self._state:
                self._state["shipped_damage"] = damaged
                _LOG.warning(
                    "tfdet: the %s library shipped in %s is not used: %s "
                    "(reinstall tfdet).",
                    self.name,
                    directory,
                    damaged,
                )
            return None
        return target, manifest["origin"]

    def library_path(self) -> Path:
        """Where this library is cached for the running TensorFlow.

        The key leaves out the include and library directories in
        TensorFlow's flags (where it is installed, not what it is) and the
        compiler (see the module docstring).
        """
        import tensorflow as tf

        tf_flags = [
            flag
            for flag in (
                *tf.sysconfig.get_compile_flags(),
                *tf.sysconfig.get_link_flags(),
            )
            if not flag.startswith(("-I", "-L"))
        ]
        key = [
            _build.source_key(self.source),
            tf.version.GIT_VERSION,
            platform.machine(),
        ]
        digest = hashlib.sha256("\0".join([*key, *tf_flags]).encode())
        return (
            cache_dir()
            / f"tf{tf.__version__}-{digest.hexdigest()[:16]}"
            / f"{self.name}.so"
        )

    def build(self) -> Path:
        """The library for this process: shipped, cached, or built into the
        cache now; returns its path (`origin()` then says which).

        A failure is kept: a second call in the process raises it again
        rather than run the compiler again.

        Raises:
            RuntimeError: not shipped nor cached, and no C++ compiler or the
                build failed (with its output).
            OSError: the cache's directory cannot be made or written.
        """
        if "failure" in self._state:
            raise self._state["failure"]
        try:
            found = self.shipped()
            if found is None:
                found = self._cached(), "cache"
        except (RuntimeError, OSError) as error:  # OSError: the cache's directory.
            self._state["failure"] = error
            raise
        self._state["origin"] = found[1]
        return found[0]

    def _cached(self) -> Path:
        import tensorflow as tf

        target = self.library_path()
        damaged = _build.damage(target) if target.exists() else None
        if target.exists() and damaged is None:
            return target
        found = compiler()
        if found is None:
            if damaged is not None:
                raise RuntimeError(
                    f"the library in {target.parent} is damaged ({damaged}), "
                    "and no C++ compiler (set CXX or install g++) can build it "
                    f"again: delete {target.parent}, or build it where a "
                    "compiler is and copy it whole"
                )
            raise RuntimeError(
                "none shipped with tfdet for TensorFlow "
                f"{_build.minor(tf.__version__)} on {platform.machine()}, "
                f"no C++ compiler (set CXX or install g++) and no build in "
                f"{target.parent}"
            )
        with _locked(target.parent):
            # Another process may have built it while we waited.
            if not target.exists() or _build.damage(target) is not None:
                _build.compile_library(
                    found,
                    self.source,
                    target,
                    tuple(tf.sysconfig.get_compile_flags()),
                    tuple(tf.sysconfig.get_link_flags()),
                )
        return target

    def within_reach(self) -> bool:
        """Whether a process here can have the library without a cache:
        shipped with tfdet for this TensorFlow, or a C++ compiler found."""
        return self.shipped() is not None or compiler() is not None

    def where(self) -> str:
        """Where this process would find the library, without building or
        loading it: "wheel PATH", "install PATH", "cache PATH", "built at
        first use by COMPILER", or "nowhere: REASON"."""
        if "failure" in self._state:
            return f"nowhere: {self._state['failure']}"
        shipped = self.shipped()
        if shipped is not None:
            return f"{shipped[1]} {shipped[0]}"
        cached = self.library_path()
        if cached.exists() and _build.damage(cached) is None:
            return f"cache {cached}"
        found = compiler()
        if found is not None:
            return f"built at first use by {found} into {cached.parent}"
        return (
            "nowhere: none shipped for this TensorFlow and machine, none "
            "cached, and no C++ compiler (the compositions run instead)"
        )

    def origin(self) -> str | None:
        """Where the library this process found came from (one of
        `ORIGINS`), or None before `build()` found one."""
        return self._state.get("origin")

    def load(self) -> Any:
        """The loaded op library, found or built first; None where it cannot be.

        The first failure is logged once (tfdet's logger, a warning) with the
        reason; later calls return None at once.
        """
        if _EXPORTS[0] or tracing_for_xla():
            return None
        if "library" in self._state:
            return self._state["library"]
        import tensorflow as tf

        try:
            why = self._unusable() if self._unusable is not None else None
            if why is not None:
                raise RuntimeError(why)
            library = tf.load_op_library(str(self.build()))
        except (RuntimeError, OSError, tf.errors.NotFoundError) as error:
            _LOG.warning(
                "tfdet: the kernels of %s are unavailable (%s); %s.",
                self.source.name,
                error,
                self._fallback,
            )
            library = None
        else:
            if self._register is not None:
                self._register(tf)
        self._state["library"] = library
        return library

    def loaded(self) -> bool:
        """Whether an earlier `load()` in this process loaded the library."""
        return self._state.get("library") is not None


def build_together(
    libraries: Iterable[KernelLibrary],
) -> dict[KernelLibrary, Path | RuntimeError | OSError]:
    """Builds `libraries` side by side, a compiler process each (about 40 s
    of one core each: together they take the longest one's time); the path
    of each, or the error its build raised (kept for its `load()` to say).
    """
    # A library that load() already decided on needs no build.
    pending = [
        library
        for library in dict.fromkeys(libraries)
        if "library" not in library._state
    ]
    if not pending:
        return {}
    import tensorflow  # noqa: F401  (once, before the threads ask for it)

    with concurrent.futures.ThreadPoolExecutor(len(pending)) as pool:
        builds = {library: pool.submit(library.build) for library in pending}
    found: dict[KernelLibrary, Path | RuntimeError | OSError] = {}
    for library, build in builds.items():
        try:
            found[library] = build.result()
        except (RuntimeError, OSError) as error:
            found[library] = error
    return found
