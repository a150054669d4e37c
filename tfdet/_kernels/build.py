"""Compiling tfdet's kernels against a TensorFlow, and the libraries shipped.

Standard library only: `setup.py` runs this module in pip's build
environment, where neither tfdet's dependencies nor TensorFlow may be
importable, and `ci/build_wheel.py` builds with it against TensorFlow
wheels that are unpacked, not installed. Both need only what a TensorFlow
wheel holds on disk: its C++ headers (`tensorflow/include`) and its
framework library (`libtensorflow_framework.so.2`).

A library is bound to the TensorFlow minor it was built against (TensorFlow
keeps no C++ ABI across minors: a library built on 2.21 refuses to load on
2.16 with an undefined `absl::lts_20250814` symbol). So the shipped ones are
kept one directory per minor and machine, `lib/tf2.21-x86_64/`, each with
a manifest (`BUILD.json`) that says what built them and from which
sources, and each library with its SHA-256 beside it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# The C++ sources, one library each.
SOURCES = Path(__file__).with_name("src")
# The libraries shipped with tfdet (built by a wheel's build or at install).
SHIPPED = Path(__file__).with_name("lib")
MANIFEST = "BUILD.json"
# Never -ffast-math: a kernel's order of operations is its bits.
# -ffp-contract=off keeps the compiler from fusing the code's own
# multiplications and additions into FMAs. -fno-sized-deallocation keeps
# the libraries off a C++ ABI newer than TensorFlow 2.16's (see
# src/runtime_floor.h).
COMMON_FLAGS = (
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-O3",
    "-ffp-contract=off",
    "-fno-sized-deallocation",
    "-w",
)
# Each library's own flags on each machine it is built for. The portable
# functions' exp step is TensorFlow's own Exp functor at the packet width of
# TensorFlow's x86-64 wheels (AVX), so that it takes the same path per
# element: x86-64 only.
OWN_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "fixed_order_products": {"x86_64": (), "aarch64": ()},
    "portable_functions": {"x86_64": ("-mavx",)},
    # Eigen's packet functions as TensorFlow's x86-64 wheels compute them
    # (AVX2 without FMA: multiply-adds unfused), on both machines: on
    # aarch64 Eigen fuses them where __ARM_FEATURE_FMA is defined.
    "portable_math": {"x86_64": ("-mavx2",), "aarch64": ("-U__ARM_FEATURE_FMA",)},
}


def libraries_for(machine: str | None = None) -> tuple[str, ...]:
    """The libraries built for `machine` (this one)."""
    machine = machine or platform.machine()
    return tuple(name for name, flags in OWN_FLAGS.items() if machine in flags)


# What a TensorFlow 2.16-2.21 wheel's `tf.sysconfig` adds to the include
# and library directories (checked against the installed TensorFlow's by
# the tests): the C++11 ABI of its manylinux builds, its C++ standard and
# Eigen's alignment.
TENSORFLOW_COMPILE_FLAGS = (
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "--std=c++17",
    "-DEIGEN_MAX_ALIGN_BYTES=64",
)
FRAMEWORK_LIBRARY = "libtensorflow_framework.so.2"
# The distributions that install the `tensorflow` package.
TENSORFLOW_DISTRIBUTIONS = frozenset(
    {
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-intel",
        "tensorflow-aarch64",
        "tensorflow-cpu-aws",
        "tf-nightly",
        "tf-nightly-cpu",
    }
)


class BuildError(RuntimeError):
    """A library could not be built (no compiler, or it failed)."""


def find_compiler() -> str | None:
    """The C++ compiler to build with (`CXX`, else g++ or c++), or None."""
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def own_flags(name: str, machine: str | None = None) -> tuple[str, ...]:
    """The flags library `name` is built with on `machine` (this one)."""
    return OWN_FLAGS.get(name, {}).get(machine or platform.machine(), ())


def source_key(source: Path, machine: str | None = None) -> str:
    """What a library's code follows from us: its source, the headers beside
    it, and its flags."""
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.rglob("*.h")):
        name = header.relative_to(source.parent).as_posix()
        digest.update(name.encode() + b"\0" + header.read_bytes())
    digest.update("\0".join([*COMMON_FLAGS, *own_flags(source.stem, machine)]).encode())
    return digest.hexdigest()


def sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_path(library: Path) -> Path:
    """Where a built library's SHA-256 is recorded."""
    return library.with_name(library.name + ".sha256")


def damage(library: Path) -> str | None:
    """Why `library` cannot be trusted, or None when it is whole."""
    try:
        recorded = digest_path(library).read_text().strip()
    except OSError:
        return f"no checksum was recorded beside it ({digest_path(library).name})"
    found = sha256(library)
    if found != recorded:
        return f"its SHA-256 is {found[:16]}..., not the {recorded[:16]}... its build recorded"
    return None


def compile_library(
    compiler: str,
    source: Path,
    target: Path,
    tensorflow_compile_flags: tuple[str, ...],
    tensorflow_link_flags: tuple[str, ...],
    machine: str | None = None,
) -> None:
    """Builds the library of `source` into `target`, its checksum beside it.

    Built in a scratch directory beside `target` and moved into place, the
    checksum first: a library in place always has one, and a reader never
    sees half a file.

    Raises:
        BuildError: the compiler failed, or wrote no library.
        OSError: `target`'s directory cannot be written.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [
            compiler,
            *COMMON_FLAGS,
            *own_flags(source.stem, machine),
            *tensorflow_compile_flags,
            str(source),
            "-o",
            str(built),
            *tensorflow_link_flags,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(
                f"the build failed ({' '.join(command)}):\n{done.stderr[-2000:]}"
            )
        if not built.is_file() or built.stat().st_size == 0:
            raise BuildError(
                f"{compiler} exited 0 but wrote no library ({' '.join(command)}): "
                "is it a C++ compiler? Set CXX to one (g++, clang++)"
            )
        checksum = Path(scratch) / digest_path(target).name
        checksum.write_text(sha256(built) + "\n")
        os.replace(checksum, digest_path(target))
        os.replace(built, target)


def minor(version: str) -> str:
    """ "2.21" of "2.21.0" (or of "2.21.0rc1")."""
    return ".".join(version.split(".")[:2])


def shipped_directory(tensorflow_version: str, machine: str | None = None) -> Path:
    """Where the libraries for a TensorFlow minor and a machine are shipped."""
    return SHIPPED / f"tf{minor(tensorflow_version)}-{machine or platform.machine()}"


def read_manifest(directory: Path) -> dict | None:
    """A shipped directory's manifest, or None where there is none or it is
    not JSON (then nothing in it is used)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def find_tensorflow(site: Path) -> tuple[str, Path] | None:
    """The version and `tensorflow/` directory of a TensorFlow wheel installed
    or unpacked into `site`, read from its metadata (no import), or None.

    Any of TensorFlow's distributions (tensorflow, tensorflow-cpu,
    tensorflow-aarch64, ...) installs the same `tensorflow` package.
    """
    package = site / "tensorflow"
    if not (package / "include").is_dir() or not (package / FRAMEWORK_LIBRARY).exists():
        return None
    for metadata in sorted(site.glob("t*.dist-info/METADATA")):
        fields = dict(
            re.findall(
                r"^(Name|Version): (.+)$", metadata.read_text(errors="replace"), re.M
            )
        )
        name = fields.get("Name", "").strip().lower().replace("_", "-")
        if name in TENSORFLOW_DISTRIBUTIONS:
            return fields["Version"].strip(), package
    return None


def build_shipped(
    compiler: str,
    site: Path,
    origin: str,
    destination: Path = SHIPPED,
    machine: str | None = None,
) -> Path:
    """Builds every library against the TensorFlow in `site` into
    `destination/tf<minor>-<machine>/`, with its manifest; returns that
    directory.

    Args:
        compiler: The C++ compiler (a cross compiler for another `machine`).
        site: A directory a TensorFlow wheel is installed or unpacked into.
        origin: "wheel" (a release's build) or "install" (a source install).
        destination: The `lib/` directory to fill.
        machine: The machine the libraries are for (this one by default).

    Raises:
        BuildError: no TensorFlow in `site`, or a build failed.
    """
    machine = machine or platform.machine()
    found = find_tensorflow(site)
    if found is None:
        raise BuildError(f"no TensorFlow wheel's C++ headers and library in {site}")
    version, package = found
    directory = destination / f"tf{minor(version)}-{machine}"
    compile_flags = (f"-I{package / 'include'}", *TENSORFLOW_COMPILE_FLAGS)
    link_flags = (f"-L{package}", f"-l:{FRAMEWORK_LIBRARY}")
    # Side by side, a compiler process each: the build takes the longest one's time.
    with concurrent.futures.ThreadPoolExecutor(len(OWN_FLAGS)) as pool:
        builds = [
            pool.submit(
                compile_library,
                compiler,
                SOURCES / f"{name}.cc",
                directory / f"{name}.so",
                compile_flags,
                link_flags,
                machine,
            )
            for name in libraries_for(machine)
        ]
    for finished in builds:
        finished.result()  # Raises the first failure.
    version_line = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True
    ).stdout.splitlines()
    manifest = {
        "origin": origin,
        "tensorflow": version,
        "machine": machine,
        "compiler": version_line[0] if version_line else compiler,
        "sources": {
            name: source_key(SOURCES / f"{name}.cc", machine)
            for name in libraries_for(machine)
        },
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return directory
