"""tfdet's build: the Python package, and its kernels built into the wheel.

Everything else about the package is in pyproject.toml. The kernels (C++
TensorFlow ops, `tfdet/_kernels/src/`) are bound to the TensorFlow minor
they are built against, so a wheel carries them one directory per minor and
machine, `tfdet/_kernels/lib/tf<minor>-<machine>/`:

- a release's wheel (`ci/build_wheel.py`): `TFDET_SHIPPED_KERNELS` names a
  directory of such directories, built beforehand against every minor's own
  TensorFlow wheel (origin "wheel"), copied in whole; `TFDET_WHEEL_PLATFORM`
  is the wheel's platform tag (say `manylinux_2_27_x86_64`);
- a source install (`pip install .`): the kernels are built here against
  the TensorFlow installed where tfdet goes (origin "install"), or, where
  none is installed yet, against the one `tfdet_build_backend.py` asked pip
  to put in the build environment, the newest the `cpu` extra admits.

`TFDET_BUILD_KERNELS=0` builds none (a wheel for another machine). An
editable install builds none: a checkout builds its kernels at first use,
into the cache. Where no C++ compiler is found, the wheel holds no kernel,
the build says so, and tfdet builds them at first use where a compiler is,
or computes the compositions.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def kernel_build():
    """tfdet/_kernels/build.py, loaded by its path (tfdet's own imports
    need packages the build environment does not have)."""
    spec = importlib.util.spec_from_file_location(
        "tfdet_kernel_build", HERE / "tfdet" / "_kernels" / "build.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def installing_interpreters_site() -> Path | None:
    """The site directory of the TensorFlow installed for the Python that runs
    this build, seen past pip's build isolation (which sets PYTHONPATH and
    PYTHONNOUSERSITE to hide it), or None."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")
    }
    found = subprocess.run(
        [sys.executable, "-c",
         "import importlib.util as u; s = u.find_spec('tensorflow'); "
         "print(s.submodule_search_locations[0] if s else '')"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    package = found.stdout.strip()
    return Path(package).parent if found.returncode == 0 and package else None


def build_environments_site() -> Path | None:
    """The site directory of a TensorFlow importable by this build, or None."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def tensorflow_site() -> Path | None:
    """Where the TensorFlow to build the kernels against is installed."""
    return installing_interpreters_site() or build_environments_site()


class build_py_with_kernels(build_py):
    """build_py, then the kernels into the build's `tfdet/_kernels/lib/`."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        destination = Path(self.build_lib) / "tfdet" / "_kernels" / "lib"
        # Exactly what this build makes: an earlier build's in build/ stays out.
        shutil.rmtree(destination, ignore_errors=True)
        if os.environ.get("TFDET_BUILD_KERNELS") == "0":
            return
        prebuilt = os.environ.get("TFDET_SHIPPED_KERNELS")
        if prebuilt:
            for directory in sorted(Path(prebuilt).glob("tf*-*")):
                shutil.copytree(directory, destination / directory.name)
            return
        build = kernel_build()
        compiler = build.find_compiler()
        site = tensorflow_site()
        if compiler is None or site is None:
            print(
                "tfdet: no kernels built into this wheel ("
                + ("no C++ compiler" if compiler is None else "no TensorFlow found")
                + "); tfdet builds them at first use where a compiler is",
                file=sys.stderr,
            )
            return
        directory = build.build_shipped(compiler, site, "install", destination)
        print(f"tfdet: kernels built into {directory.name}", file=sys.stderr)


def bdist_wheel_command():
    """bdist_wheel, tagged for this machine when it holds kernels."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:  # setuptools < 70.1: the wheel package's.
        from wheel.bdist_wheel import bdist_wheel

    class bdist_wheel_with_kernels(bdist_wheel):
        def finalize_options(self) -> None:
            super().finalize_options()
            # Decided before build_py runs: a wheel that may hold kernels
            # is this machine's (py3, any Python ABI: the kernels use
            # TensorFlow's C++ API, not Python's).
            self.root_is_pure = os.environ.get("TFDET_BUILD_KERNELS") == "0"

        def get_tag(self) -> tuple[str, str, str]:
            python, abi, plat = super().get_tag()
            if self.root_is_pure:
                return python, abi, plat
            return "py3", "none", os.environ.get("TFDET_WHEEL_PLATFORM", plat)

    return bdist_wheel_with_kernels


# The TensorFlow a fresh machine's source install builds its kernels
# against (see tfdet_build_backend.py): the `cpu` extra's, whose release pip
# then installs; on aarch64 the `tensorflow` distribution (the same package).
TENSORFLOW_FOR_BUILD = (
    "tensorflow-cpu" if platform.machine() == "x86_64" else "tensorflow"
) + re.search(
    r'^cpu = \["tensorflow-cpu([^"]*)"\]',
    (HERE / "pyproject.toml").read_text(),
    re.MULTILINE,
).group(1)

if __name__ == "__main__":  # As setuptools runs it (the backend imports it).
    setup(
        cmdclass={
            "build_py": build_py_with_kernels,
            "bdist_wheel": bdist_wheel_command(),
        }
    )
