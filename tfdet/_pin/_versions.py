"""Version facts in one place: what is installed, which Keras is in use.

Nothing here imports TensorFlow at module import time: `import tfdet` must not
start TensorFlow, or settings read at `import tensorflow` could no longer be
pinned.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys

from packaging.version import InvalidVersion, Version

MIN_TENSORFLOW = Version("2.16")
# The oldest Keras 3 tfdet runs on (the version matrix, ci/matrix.py): Keras
# 3.0 lacks internals that tfdet's patches use (`keras.src.tree`, the seed
# generators' layout), and TensorFlow 2.17-2.19 need 3.2-3.5 themselves.
MIN_KERAS = Version("3.5")
# XLA:CPU's ISA cap, `--xla_cpu_max_isa`, exists from TensorFlow 2.19; the XLA
# of 2.16-2.18 aborts the process at its first compilation on an unknown
# flag (`Unknown flags in XLA_FLAGS`).
XLA_CPU_ISA_CAP_SINCE = Version("2.19")

# TensorFlow ships under several distribution names that install the same
# `tensorflow` package; the first one found is the one in use.
_TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
)


def distribution_version(name: str) -> str | None:
    """Returns the installed version of a distribution, or None."""
    return _installed_version(name)


# Each look-up walks every sys.path entry's metadata (about 1.5 ms), and
# enable() asks about 70 times; what is installed does not change under a
# running process.
@functools.cache
def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_distribution() -> tuple[str, str] | None:
    """Returns `(distribution name, version)` of the installed TensorFlow."""
    for name in _TENSORFLOW_DISTRIBUTIONS:
        version = distribution_version(name)
        if version is not None:
            return name, version
    return None


def uses_legacy_keras() -> bool:
    """Whether `tf.keras` resolves to tf_keras (Keras 2) in this process."""
    # Exactly TensorFlow's own test (tensorflow/__init__.py, lazy_loader.py):
    # "yes" or "TRUE" leave TensorFlow on Keras 3, so they must here too.
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def keras_flavor() -> str:
    """`"tf_keras"` when TF_USE_LEGACY_KERAS is on, else `"keras3"`."""
    return "tf_keras" if uses_legacy_keras() else "keras3"


def keras_version() -> str | None:
    """Version of the Keras in use (tf_keras or Keras 3)."""
    return distribution_version("tf_keras" if uses_legacy_keras() else "keras")


def check_keras_version() -> None:
    """Refuses a Keras in use that tfdet cannot run on.

    That is a Keras 3 older than `MIN_KERAS`, or, with TF_USE_LEGACY_KERAS,
    no tf_keras at all (TensorFlow would fail on `tf.keras` later).

    Raises:
        ImportError: with the installed version and the command that fixes it.
    """
    if uses_legacy_keras():
        if distribution_version("tf_keras") is None:
            found = tensorflow_distribution()
            minor = ".".join(found[1].split(".")[:2]) if found else "<TF version>"
            raise ImportError(
                "TF_USE_LEGACY_KERAS asks for tf_keras (Keras 2), which is not "
                f"installed. Install the one matching TensorFlow: `pip install "
                f"--no-deps 'tf_keras=={minor}.*'`, or unset TF_USE_LEGACY_KERAS."
            )
        return
    version = distribution_version("keras")
    if version is not None and Version(Version(version).base_version) < MIN_KERAS:
        raise ImportError(
            f"tfdet needs Keras >= {MIN_KERAS}. Received: keras=={version}. "
            f"Upgrade with `pip install -U 'keras>={MIN_KERAS}'`."
        )


# (platform.system(), platform.machine()) pairs tfdet's tests run on: Linux
# aarch64 in an emulated aarch64 process on every change (QEMU's user-mode
# emulator, `ci/aarch64.py`), not yet on an ARM CPU.
TESTED_PLATFORMS = frozenset({("Linux", "x86_64"), ("Linux", "aarch64")})


def untested_platform() -> str | None:
    """ "<system> <machine>" when tfdet never ran on this platform, else None."""
    here = (platform.system(), platform.machine())
    return None if here in TESTED_PLATFORMS else " ".join(here)


def python_version() -> str:
    return platform.python_version()


def numpy_version() -> str:
    import numpy

    return numpy.__version__


def tensorflow_version() -> str:
    """Version of the importable `tensorflow`, checked against the minimum.

    Raises:
        ImportError: TensorFlow is missing or older than 2.16, with the fix.
    """
    found = tensorflow_distribution()
    if found is None:
        raise ImportError(
            "tfdet needs TensorFlow >= 2.16 and none is installed. Install "
            "one build: `pip install tfdet[cpu]` (tensorflow-cpu) or "
            "`pip install tfdet[gpu]` (tensorflow[and-cuda])."
        )
    name, version = found
    if Version(version) < MIN_TENSORFLOW:
        raise ImportError(
            f"tfdet needs TensorFlow >= {MIN_TENSORFLOW}. Received: {name}=="
            f"{version}. Upgrade with `pip install -U {name}`."
        )
    return version


def tensorflow_imported() -> bool:
    """Whether `import tensorflow` already ran in this process."""
    return "tensorflow" in sys.modules


def xla_cpu_isa_cap_known() -> bool:
    """Whether the installed TensorFlow's XLA knows `--xla_cpu_max_isa`.

    Read from the installed distribution's version, without importing
    TensorFlow (the flag must be decided before XLA starts). Unknown or
    unparsable versions count as new enough.
    """
    found = tensorflow_distribution()
    if found is None:
        return True
    try:
        release = Version(Version(found[1]).base_version)
    except InvalidVersion:
        return True
    return release >= XLA_CPU_ISA_CAP_SINCE
