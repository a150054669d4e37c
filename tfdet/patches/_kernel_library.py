"""tfdet's own TensorFlow ops: C++ sources built at first use, then cached.

Each library (`KernelLibrary`) is a TensorFlow custom op compiled against the
installed TensorFlow (`tf.sysconfig`'s flags, the C++ compiler `CXX` or
`g++`), cached under `TFDET_KERNEL_CACHE`, else `$XDG_CACHE_HOME/tfdet/kernels`
(`~/.cache/tfdet/kernels`), built under a file lock and moved into place
atomically, so parallel processes build it once.

The cache is keyed by what the library's code depends on: the TensorFlow
build (version and git revision), the CPU architecture, the source and the
flags, not by where TensorFlow is installed nor by the compiler. So a cache
built once serves every environment with the same TensorFlow, and a process
without a compiler loads what is there (a container's build stage fills
it, the image without a compiler runs it). The compiler is left out because
the sources fix their own arithmetic: no `-ffast-math`, no contraction of
the code's multiplications and additions, the kernels' FMAs written as
intrinsics, so a conforming compiler gives the same bits.

A library is loaded only when it is whole: a build records the library's
SHA-256 beside it (`NAME.so.sha256`, written before the library is moved
into place), and an entry whose digest is missing or differs (a copy cut
short, a full disk) is built again where a compiler is found, and refused
with a message where none is: `tf.load_op_library` on a truncated file
kills the process with SIGBUS.

Where the library is neither cached nor buildable (no compiler, a failed
build) `load()` returns None and says why once: the caller computes the
same thing as a composition of TensorFlow's ops. `pip install` never
compiles anything.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tfdet import _user_cache

_LOG = logging.getLogger("tfdet")

# Where the built libraries are kept (a directory); the tests share one build.
CACHE_VARIABLE = "TFDET_KERNEL_CACHE"
# Never -ffast-math: a kernel's order of operations is its bits.
# -ffp-contract=off keeps the compiler from fusing the code's own
# multiplications and additions into FMAs.
COMMON_FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3", "-ffp-contract=off", "-w")


def cache_dir() -> Path:
    """The directory that holds built kernels (created on build)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    return _user_cache.directory() / "kernels"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_path(library: Path) -> Path:
    """Where a built library's SHA-256 is recorded."""
    return library.with_name(library.name + ".sha256")


def damage(library: Path) -> str | None:
    """Why the cached `library` cannot be trusted, or None when it is whole."""
    try:
        recorded = digest_path(library).read_text().strip()
    except OSError:
        return f"no checksum was recorded beside it ({digest_path(library).name})"
    found = _sha256(library)
    if found != recorded:
        return f"its SHA-256 is {found[:16]}..., not the {recorded[:16]}... its build recorded"
    return None


def compiler() -> str | None:
    """The C++ compiler tfdet builds with (`CXX`, else g++ or c++), or None."""
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class KernelLibrary:
    """One C++ source of tfdet's ops, built and loaded once a process.

    Args:
        source: The `.cc` file.
        flags: Compiler flags beside `COMMON_FLAGS` (an instruction set).
        fallback: What the callers do where it cannot be built, for the
            one warning (e.g. "products use the composition instead").
        register: Called with `tensorflow` once the library loaded (its
            ops' gradients: TensorFlow refuses a second registration).
    """

    def __init__(
        self,
        source: Path,
        flags: tuple[str, ...],
        fallback: str,
        register: Callable[[Any], None] | None = None,
    ) -> None:
        self.source = source
        self.flags = flags
        self._fallback = fallback
        self._register = register
        # "library": what load() gave (None: unavailable); "failure": the
        # error a build raised (kept, so the compiler runs once a process).
        self._state: dict[str, Any] = {}

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
        digest = hashlib.sha256(self.source.read_bytes())
        key = [tf.version.GIT_VERSION, platform.machine(), *COMMON_FLAGS, *self.flags]
        digest.update("\0".join([*key, *tf_flags]).encode())
        return (
            cache_dir()
            / f"tf{tf.__version__}-{digest.hexdigest()[:16]}"
            / f"{self.source.stem}.so"
        )

    def build(self) -> Path:
        """The cached library, built first if it is not there; returns its path.

        A failure is kept: a second call in the process raises it again
        rather than run the compiler again.

        Raises:
            RuntimeError: not cached, and no C++ compiler or the build failed
                (with its output).
            OSError: the cache's directory cannot be made or written.
        """
        if "failure" in self._state:
            raise self._state["failure"]
        try:
            return self._build()
        except (RuntimeError, OSError) as error:  # OSError: the cache's directory.
            self._state["failure"] = error
            raise

    def _build(self) -> Path:
        import tensorflow as tf

        target = self.library_path()
        damaged = damage(target) if target.exists() else None
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
                f"no C++ compiler (set CXX or install g++) and no build in {target.parent}"
            )
        with _locked(target.parent):
            # Another process may have built it while we waited.
            if target.exists() and damage(target) is None:
                return target
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                command = [
                    found,
                    *COMMON_FLAGS,
                    *self.flags,
                    *tf.sysconfig.get_compile_flags(),
                    str(self.source),
                    "-o",
                    str(built),
                    *tf.sysconfig.get_link_flags(),
                ]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(
                        f"the build failed ({' '.join(command)}):\n"
                        f"{done.stderr[-2000:]}"
                    )
                if not built.is_file() or built.stat().st_size == 0:
                    raise RuntimeError(
                        f"{found} exited 0 but wrote no library ({' '.join(command)}): "
                        "is it a C++ compiler? Set CXX to one (g++, clang++)"
                    )
                # The digest first: a library in place always has one.
                checksum = Path(scratch) / digest_path(target).name
                checksum.write_text(_sha256(built) + "\n")
                os.replace(checksum, digest_path(target))
                os.replace(built, target)
        return target

    def load(self) -> Any:
        """The loaded op library, built first if needed; None where it cannot be.

        The first failure is logged once (tfdet's logger, a warning) with the
        reason; later calls return None at once.
        """
        if "library" in self._state:
            return self._state["library"]
        import tensorflow as tf

        try:
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
