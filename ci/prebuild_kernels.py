"""Builds tfdet's C++ kernels for this Python's TensorFlow, ahead of the tests.

Usage (from the repository, with the Python whose TensorFlow the tests use):
    python ci/prebuild_kernels.py

Into the kernel cache the tests read (`TFDET_KERNEL_CACHE`, which
`ci/test.sh` sets), so that no test waits for the build (about 40 s of one
core on a 2-core EPYC Zen 3): `ci/test.sh` runs it while the linters run,
`ci/matrix.py --build-only` with each combination's environment. A build
that fails exits 1 with its output; the tests then build again, or fall back
to the compositions, and say so.
"""

from __future__ import annotations

import sys

from tfdet.patches import _fixed_order_kernels, portable_kernels


def main() -> int:
    for library in (_fixed_order_kernels.LIBRARY, portable_kernels.LIBRARY):
        try:
            print(f"kernels: {library.build()}", flush=True)
        except RuntimeError as error:
            print(f"kernels not built ahead: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
