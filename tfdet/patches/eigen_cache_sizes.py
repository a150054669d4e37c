"""Eigen's blocking, the same on every CPU: its cache sizes pinned.

Eigen's matrix products split the sum over the inner dimension into blocks
whose length follows the L1 data cache the CPU reports (CPUID), so a CPU
with another L1 adds the same numbers in another order. TensorFlow runs its
CPU MatMul, Conv2D and their gradients through Eigen wherever oneDNN does
not: every one with oneDNN's custom ops off, and with them on, the products
oneDNN leaves to Eigen (bfloat16 ones under an AVX2 cap, e.g. a
`mixed_bfloat16` model). An Intel Xeon's L1d of 48K written into an AMD
EPYC's process (32K) gives a matmul, a conv2d and its filter gradient (oneDNN
off) and a `mixed_bfloat16` Conv2D model (oneDNN on) other bits
(docs/measurements.md, "Cache sizes, by imitation").

This patch writes one fixed geometry into Eigen's cached sizes (every
loaded copy, see `tfdet._pin._cache_sizes`), so every x86-64 CPU blocks
Eigen's products alike, whatever its caches. It changes no op and no value
beyond the order of additions; on a CPU whose caches differ from the pinned
ones Eigen's blocks are a little less well sized.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._pin import _cache_sizes

K = 1024
# The sizes every CPU's Eigen blocks by under tfdet: an L1d of 32K (AMD Zen,
# Intel up to Skylake/Cascade Lake), an L2 of 1M and an L3 of 32M per core
# complex, as on an AMD EPYC Zen 4.
PINNED = _cache_sizes.Geometry("tfdet's pinned geometry", 32 * K, 1024 * K, 32 * K * K)


def _apply(swap: Any) -> None:
    swap.attribute(_cache_sizes.PIN, "geometry", PINNED)


PATCH = Patch(
    summary="Eigen's cache sizes (CPUID, CPU-model dependent) -> one fixed "
    "geometry, so its matrix products split their sums alike on every CPU",
    upstream="https://gitlab.com/libeigen/eigen/-/blob/master/Eigen/src/Core/products/GeneralBlockPanelKernel.h",
    apply=_apply,
    unavailable=_cache_sizes.pin_unavailable,
)
