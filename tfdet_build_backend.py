"""tfdet's build backend: setuptools', plus a TensorFlow to build kernels against.

A source install (`pip install ".[cpu]"`) compiles tfdet's kernels into the
wheel (see setup.py) against the TensorFlow installed where tfdet goes. On
a fresh machine none is installed yet when pip builds tfdet's wheel, so
this asks pip for one in the build environment: `tensorflow-cpu` with the
`cpu` extra's bounds, which pip resolves to the same release it then
installs (it takes the second from its cache). Only where kernels will be
built: a C++ compiler is found, `TFDET_BUILD_KERNELS` is not "0", and
neither prebuilt kernels (TFDET_SHIPPED_KERNELS) nor an installed
TensorFlow serve.
Editable installs build no kernel and ask for nothing more.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 (the backend's other hooks)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import setup as _setup_module  # noqa: E402  (only reads; setup() is guarded)


def _tensorflow_for_the_build() -> list[str]:
    if os.environ.get("TFDET_BUILD_KERNELS") == "0" or os.environ.get(
        "TFDET_SHIPPED_KERNELS"
    ):
        return []
    if _setup_module.kernel_build().find_compiler() is None:
        return []
    if _setup_module.installing_interpreters_site() is not None:
        return []
    return [_setup_module.TENSORFLOW_FOR_BUILD]


def get_requires_for_build_wheel(config_settings=None):
    return [
        *build_meta.get_requires_for_build_wheel(config_settings),
        *_tensorflow_for_the_build(),
    ]
