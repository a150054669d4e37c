"""What an aarch64 CPU offers that can decide the bits, as this process sees it.

On aarch64 the kernel tells a process its CPU's features in the auxiliary
vector (`AT_HWCAP`, `AT_HWCAP2`), which an emulator fills for the CPU it
imitates; the SVE vector length comes from `prctl(PR_SVE_GET_VL)`. They
matter because TensorFlow's aarch64 wheel carries oneDNN (with its own JIT
kernels per SVE vector length, `brg:sve_512`, `brg:sve_256`, and NEON ones
below), which TensorFlow turns on by default only on a Neoverse V1; Eigen's
own kernels use NEON, 4 floats a vector, on every aarch64 CPU.

`/proc/cpuinfo` names the implementer and part on real hardware. Under
QEMU's user-mode emulator (`qemu-aarch64`) it is the host's, an x86 CPU's:
`emulated_on` says so, and the facts then come from the auxiliary vector
alone.
"""

from __future__ import annotations

import ctypes
import platform
import struct

# Linux's auxiliary-vector keys (include/uapi/linux/auxvec.h).
_AT_HWCAP = 16
_AT_HWCAP2 = 26
# The features that change which kernels run, and so the order of the sums:
# (bit, name) in AT_HWCAP and AT_HWCAP2 (arch/arm64/include/uapi/asm/hwcap.h),
# named as /proc/cpuinfo names them.
_HWCAP = ((1, "asimd"), (10, "asimdhp"), (20, "asimddp"), (22, "sve"))
_HWCAP2 = ((1, "sve2"), (13, "i8mm"), (14, "bf16"), (23, "sme"))
_PR_SVE_GET_VL = 51
_PR_SVE_VL_LEN_MASK = 0xFFFF
# `CPU implementer` codes of /proc/cpuinfo (the MIDR's top byte).
IMPLEMENTERS = {
    "0x41": "Arm",
    "0x42": "Broadcom",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}
# Arm's own parts (`CPU part` under implementer 0x41) in the servers people
# train on: Graviton2 and Ampere Altra are N1, Graviton3 V1, Graviton4 V2.
ARM_PARTS = {
    "0xd0c": "Neoverse N1",
    "0xd40": "Neoverse V1",
    "0xd49": "Neoverse N2",
    "0xd4f": "Neoverse V2",
    "0xd8e": "Neoverse N3",
    "0xd84": "Neoverse V3",
}


def applies() -> bool:
    """Whether this process runs aarch64 code (natively or emulated)."""
    return platform.machine().lower() in ("aarch64", "arm64")


def _auxv(path: str = "/proc/self/auxv") -> dict[int, int]:
    """The auxiliary vector: `{key: value}` (empty where it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    pairs = struct.iter_unpack("<QQ", data[: len(data) - len(data) % 16])
    return {key: value for key, value in pairs if key}


def features(auxv: dict[int, int] | None = None) -> list[str]:
    """The kernel-selecting features this CPU offers, e.g. `["asimd", "sve"]`."""
    auxv = _auxv() if auxv is None else auxv
    hwcap, hwcap2 = auxv.get(_AT_HWCAP, 0), auxv.get(_AT_HWCAP2, 0)
    found = [name for bit, name in _HWCAP if hwcap >> bit & 1]
    found += [name for bit, name in _HWCAP2 if hwcap2 >> bit & 1]
    return sorted(found)


def sve_vector_bits() -> int | None:
    """This thread's SVE vector length in bits; None without SVE."""
    if "sve" not in features():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = libc.prctl(_PR_SVE_GET_VL, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return None
    return (value & _PR_SVE_VL_LEN_MASK) * 8 if value > 0 else None


def emulated_on(cpuinfo_fields: dict[str, str]) -> str | None:
    """The host's architecture when /proc/cpuinfo (its first processor's
    fields, as `_environment` reads them) describes another one than this
    process runs: a user-mode emulator passes the host's through. E.g.
    "x86-64 (AuthenticAMD)"; None on real aarch64 hardware."""
    vendor = cpuinfo_fields.get("vendor_id")  # An x86 field: an x86 host.
    return None if vendor is None else f"x86-64 ({vendor})"


def describe(cpuinfo_fields: dict[str, str]) -> dict[str, str | None]:
    """Vendor and model from /proc/cpuinfo's `CPU implementer` / `CPU part`
    (real hardware), named where known (`0x41`/`0xd40`: Arm, Neoverse V1)."""
    implementer = cpuinfo_fields.get("CPU implementer")
    part = cpuinfo_fields.get("CPU part")
    vendor = IMPLEMENTERS.get(implementer or "", implementer)
    model = ARM_PARTS.get(part or "") if implementer == "0x41" else None
    return {"vendor": vendor, "model": model or part}


def environment_isa() -> str:
    """What oneDNN may pick on this CPU, in its own words: `sve_512`,
    `sve_256`, `sve_128` (its JIT kernels for that vector length) or
    `asimd` (NEON), as oneDNN's verbose log names the kernels."""
    bits = sve_vector_bits()
    return f"sve_{bits}" if bits in (128, 256, 512) else "asimd"
