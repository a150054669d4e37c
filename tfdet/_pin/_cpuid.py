"""What the CPU says of itself through CPUID, as this process sees it.

`/proc/cpuinfo` describes the machine; CPUID answers the running process,
and under an emulator (QEMU's user mode) it answers with the emulated CPU
model: another vendor, family, model and cache sizes. Libraries that pick
kernels or block sizes (oneDNN, Eigen) ask CPUID, so an emulated run reads
it here to say which CPU its libraries saw.

The instruction runs from a small page of machine code (x86-64 only); where
that cannot be done (another architecture, a system that forbids executable
memory), every function returns None.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import struct

# cpuid(leaf in edi, subleaf in esi, out in rdx): writes eax, ebx, ecx, edx.
_CODE = bytes.fromhex(
    "53"  # push rbx (callee-saved; cpuid writes it)
    "89f8"  # mov eax, edi
    "89f1"  # mov ecx, esi
    "4989d0"  # mov r8, rdx
    "0fa2"  # cpuid
    "418900"  # mov [r8], eax
    "41895804"  # mov [r8+4], ebx
    "41894808"  # mov [r8+8], ecx
    "4189500c"  # mov [r8+12], edx
    "5b"  # pop rbx
    "c3"  # ret
)


@functools.cache
def _function() -> tuple[mmap.mmap, object] | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        page = mmap.mmap(
            -1,
            mmap.PAGESIZE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC,
        )
    except (OSError, AttributeError, ValueError):
        return None
    page.write(_CODE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    kind = ctypes.CFUNCTYPE(
        None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)
    )
    # The page is kept with the function: freeing it would free the code.
    return page, kind(address)


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int] | None:
    """`(eax, ebx, ecx, edx)` of CPUID `leaf`, or None where it cannot run."""
    found = _function()
    if found is None:
        return None
    out = (ctypes.c_uint32 * 4)()
    found[1](leaf, subleaf, out)  # type: ignore[operator]
    return tuple(out)  # type: ignore[return-value]


def vendor() -> str | None:
    """The vendor string, e.g. "AuthenticAMD" or "GenuineIntel"."""
    registers = cpuid(0)
    if registers is None:
        return None
    _, ebx, ecx, edx = registers
    return struct.pack("<III", ebx, edx, ecx).decode("ascii", errors="replace")


def family_model() -> tuple[int, int] | None:
    """`(family, model)` as CPUID leaf 1 reports them (extended fields added)."""
    registers = cpuid(1)
    if registers is None:
        return None
    eax = registers[0]
    family = (eax >> 8) & 0xF
    model = (eax >> 4) & 0xF
    if family == 0xF:
        family += (eax >> 20) & 0xFF
    if family in (0x6, 0xF):
        model += ((eax >> 16) & 0xF) << 4
    return family, model


def describe() -> str | None:
    """`"GenuineIntel family 6 model 60"`: the CPU as CPUID shows it here."""
    found, numbers = vendor(), family_model()
    if found is None or numbers is None:
        return None
    return f"{found} family {numbers[0]} model {numbers[1]}"
