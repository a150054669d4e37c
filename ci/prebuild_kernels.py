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

import concurrent.futures
import sys

import tensorflow  # noqa: F401  (once, before the builds' threads ask for it)

from tfdet.patches import _fixed_order_kernels, portable_kernels


def main() -> int:
    libraries = (_fixed_order_kernels.LIBRARY, portable_kernels.LIBRARY)
    # Each build is a compiler process of its own, and the cache locks per
    # library: one thread each.
    with concurrent.futures.ThreadPoolExecutor(len(libraries)) as pool:
        builds = [pool.submit(library.build) for library in libraries]
    failed = False
    for build in builds:
        try:
            print(f"kernels: {build.result()}", flush=True)
        except RuntimeError as error:
            print(f"kernels not built ahead: {error}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
