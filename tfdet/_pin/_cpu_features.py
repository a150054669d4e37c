"""TensorFlow's own view of the CPU's extensions, capped like oneDNN's ISA.

TensorFlow reads the CPU's extensions once, through CPUID, into
`tsl::port::CPUIDInfo`, and decides from it where some ops run: a bfloat16
op goes to oneDNN when the CPU has AVX-512F or AVX-NE-CONVERT
(`IsBF16SupportedByOneDNNOnThisCPU`, tensorflow/core/util/util.cc), to Eigen
otherwise. oneDNN itself obeys `ONEDNN_MAX_CPU_ISA`, which TensorFlow does
not read. So under tfdet's AVX2 cap an AVX-512 CPU sends a `mixed_bfloat16`
model's convolution to oneDNN, which has no bfloat16 kernel below AVX-512
and fails ("could not create a primitive descriptor for the convolution
forward propagation primitive"), while an AVX2-only CPU runs the same op in
Eigen.

`VIEW.cap = isa` clears, in TensorFlow's `CPUIDInfo`, every extension above
`isa`, so TensorFlow decides as a CPU with only what the cap allows does;
`VIEW.cap = None` puts them back. The object's layout (one bit per
extension) is learned from TensorFlow's own `TestCPUFeature`: a bit is
cleared only when flipping it turns off that one extension and changes no
other answer; if an extension has no such bit, nothing is written.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from typing import Any

from tfdet._pin import _cache_sizes, _isa

# `tsl::port::(anonymous namespace)::cpuid`, the `CPUIDInfo*` TensorFlow
# fills once, and `tsl::port::TestCPUFeature(CPUFeature)`, which reads it.
_CPUID = "_ZN3tsl4port12_GLOBAL__N_15cpuidE"
_TEST = "_ZN3tsl4port14TestCPUFeatureENS0_10CPUFeatureE"
_SYMBOLS = (_CPUID, _TEST)
# Where tsl's platform code lives (libtensorflow_cc's string table alone is
# 175 MB: not read for these).
_LIBRARY = ("libtensorflow_framework.so.2",)
# `tsl::port::CPUFeature` values (tsl/platform/cpu_info.h) of the vector
# extensions a oneDNN cap names, AVX and above, with their /proc/cpuinfo flag
# (FMA and F16C, which every AVX2 CPU has, are left alone).
EXTENSIONS = {
    12: "avx",
    14: "avx2",
    27: "avx512f",
    28: "avx512cd",
    29: "avx512er",
    30: "avx512pf",
    31: "avx512vl",
    32: "avx512bw",
    33: "avx512dq",
    34: "avx512vbmi",
    35: "avx512ifma",
    36: "avx512_4vnniw",
    37: "avx512_4fmaps",
    38: "avx512_vnni",
    39: "avx512_bf16",
    40: "avx_vnni",
    41: "amx_tile",
    42: "amx_int8",
    43: "amx_bf16",
    44: "avx512_fp16",
    45: "amx_fp16",
    46: "avx_ne_convert",
    47: "avx_vnni_int8",
}
# Every `CPUFeature` value asked while probing (MMX = 0 to AVX_VNNI_INT8).
_FEATURES = range(48)
# The bytes of `CPUIDInfo` probed: its one-bit fields come first.
_PROBED_BYTES = 8


class CpuFeaturesError(RuntimeError):
    """TensorFlow's `CPUIDInfo` is not where or what this module expects."""


def unavailable() -> str | None:
    """None where `VIEW.cap` can work here, else why not."""
    if platform.system() != "Linux" or not _isa.applies():
        return (
            "only on Linux x86-64 (TensorFlow's CPU description in its ELF libraries)"
        )
    if not _cache_sizes.symbols_found(_SYMBOLS, _LIBRARY):
        return (
            "this TensorFlow build's libraries do not name its CPU description "
            "(tsl::port::CPUIDInfo) in a symbol table"
        )
    return None


@functools.cache
def _accessors() -> tuple[Any, Any]:
    """`(TestCPUFeature, the first bytes of CPUIDInfo)` in this process."""
    import tensorflow  # noqa: F401  (loads the library and fills CPUIDInfo)

    for path, symbols in _cache_sizes.library_symbols(_SYMBOLS, _LIBRARY).items():
        if set(_SYMBOLS) <= set(symbols):
            base = _cache_sizes.load_address(path)
            test = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_int)(
                base + symbols[_TEST][0]
            )
            test(0)  # Fills CPUIDInfo if TensorFlow has not yet.
            info = ctypes.c_void_p.from_address(base + symbols[_CPUID][0]).value
            if not info:
                break
            return test, (ctypes.c_uint8 * _PROBED_BYTES).from_address(info)
    raise CpuFeaturesError(
        "Expected TensorFlow's CPU description (tsl::port::CPUIDInfo) in its "
        "libraries. Found none; nothing written."
    )


def _bits_of(features: list[int]) -> dict[int, tuple[int, int]]:
    """`{feature: (byte, bit)}`: the one bit that answers for each feature."""
    test, raw = _accessors()
    answers = [test(feature) for feature in _FEATURES]
    found = {}
    for byte in range(_PROBED_BYTES):
        for bit in range(8):
            raw[byte] ^= 1 << bit
            changed = [f for f in _FEATURES if test(f) != answers[f]]
            raw[byte] ^= 1 << bit
            if len(changed) == 1 and changed[0] in features:
                found[changed[0]] = (byte, bit)
    missing = sorted(set(features) - set(found))
    if missing:
        raise CpuFeaturesError(
            "Expected one bit of TensorFlow's CPU description to answer for "
            f"each of {[EXTENSIONS[f] for f in missing]}. Found none; nothing "
            "written."
        )
    return found


class _View:
    """TensorFlow's extensions, as one attribute a patch's `Swap` can set."""

    def __init__(self) -> None:
        self._cap: str | None = None
        self._cleared: dict[int, tuple[int, int]] = {}

    @property
    def cap(self) -> str | None:
        """The ISA TensorFlow's view is capped at (None: the CPU's own)."""
        return self._cap

    @cap.setter
    def cap(self, isa: str | None) -> None:
        if self._cleared:  # Put back what an earlier cap hid.
            _, raw = _accessors()
            for byte, bit in self._cleared.values():
                raw[byte] |= 1 << bit
        self._cleared, self._cap = {}, None
        allowed = None if isa is None else _isa.flags_allowed(isa)
        if allowed is not None:
            test, raw = _accessors()
            above = [
                feature
                for feature, flag in EXTENSIONS.items()
                if flag not in allowed and test(feature)
            ]
            self._cleared = _bits_of(above) if above else {}
            for byte, bit in self._cleared.values():
                raw[byte] &= ~(1 << bit) & 0xFF
        self._cap = isa

    def hidden(self) -> tuple[str, ...]:
        """The /proc/cpuinfo names of the extensions hidden now."""
        return tuple(EXTENSIONS[feature] for feature in sorted(self._cleared))


VIEW = _View()
