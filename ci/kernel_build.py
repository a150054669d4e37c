"""tfdet/_kernels/build.py, loaded by its path for ci's scripts.

ci/build_wheel.py and ci/aarch64.py compile tfdet's kernels with this
machine's Python, which need not have tfdet or its dependencies installed
(the module is standard library only).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BUILD = Path(__file__).resolve().parents[1] / "tfdet" / "_kernels" / "build.py"


def load() -> ModuleType:
    """The module, loaded once a call."""
    spec = importlib.util.spec_from_file_location("tfdet_kernel_build", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
