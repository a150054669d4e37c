"""The portable functions' library (`src/portable_functions.cc`).

`tfdet.patches.portable_kernels` uses its one op, `TfdetPortableErfc`, and
checks it against the composition it replaces before its first use.
"""

from __future__ import annotations

from tfdet._kernels import build, library

LIBRARY = library.KernelLibrary(
    build.SOURCES / "portable_functions.cc",
    fallback="the portable functions run as compositions of TensorFlow's ops "
    "instead (the same bits, slower)",
)
