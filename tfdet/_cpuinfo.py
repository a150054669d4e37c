"""What Linux says of the CPU in /proc/cpuinfo.

At the bottom of the package: the pins read the CPU's model and feature
flags (the oneDNN ISA cap, the profile's CPU facts), the kernels its flags
(whether the CPU runs what they were compiled for).
"""

from __future__ import annotations


def fields(names: tuple[str, ...]) -> dict[str, str]:
    """The first value of each of `names` in /proc/cpuinfo (absent: left out)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in names and key not in found:
                    found[key] = value.strip()
                if not line.strip() and found:
                    break  # The first processor's block is enough.
    except OSError:
        pass
    return found


def flags() -> frozenset[str]:
    """The x86 CPU feature flags (empty where /proc/cpuinfo has none)."""
    return frozenset(fields(("flags",)).get("flags", "").split())
