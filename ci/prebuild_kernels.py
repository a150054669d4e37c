"""Builds tfdet's C++ kernels for this Python's TensorFlow, ahead of the tests.

Usage (from the repository, with the Python whose TensorFlow the tests use):
    python ci/prebuild_kernels.py

Into the kernel cache the tests read (`TFDET_KERNEL_CACHE`, which
`ci/test.sh` sets), so that no test waits for the build (about 40 s of one
core each on a 2-core EPYC Zen 3; the libraries are built side by side):
`ci/test.sh` runs it while the rest installs and the linters run,
`ci/matrix.py --build-only` with each combination's environment. A build
that fails exits 1 with its output; the tests then build again, or fall back
to the compositions, and say so.
"""

from __future__ import annotations

import sys

from tfdet._kernels import library as kernel_library
from tfdet._patching import _registry


def main() -> int:
    # Every patch's kernel (two patches share the fixed-order library).
    libraries = [p.kernel for p in _registry.available().values() if p.kernel]
    failed = False
    for built in kernel_library.build_together(libraries).values():
        if isinstance(built, Exception):
            print(f"kernels not built ahead: {built}", file=sys.stderr)
            failed = True
        else:
            print(f"kernels: {built}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
