"""The CPUs this process may use: its affinity mask and its cgroup's quota.

`tfdet.enable()` sizes TensorFlow's pools with them by default, and `tfdet
cost` times its settings on them. A container limited by a CPU quota
(`docker run --cpus 2`) still sees every core of the host in its affinity
mask; TensorFlow's own default counts those, and a pool of 64 threads on a
quota of 2 CPUs spends its time waiting for the scheduler.
"""

from __future__ import annotations

import math
import os

# cgroup v2 writes "max 100000" or "200000 100000"; v1 two files, -1 for none.
_CGROUP_V2_MAX = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
_CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def affinity() -> list[int] | None:
    """The CPUs this process may run on, or None where the OS cannot say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _read_words(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().split()
    except (OSError, UnicodeDecodeError):
        return []


def quota_cpus() -> int | None:
    """The CPUs the cgroup's quota allows, rounded up; None without a quota."""
    words = _read_words(_CGROUP_V2_MAX)
    if len(words) == 2:
        quota, period = words
    else:
        quota = "".join(_read_words(_CGROUP_V1_QUOTA))
        period = "".join(_read_words(_CGROUP_V1_PERIOD))
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # "max", or no such file.
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, math.ceil(quota_us / period_us))


def usable_cpus() -> int:
    """How many CPUs this process may use: its affinity mask, capped by its
    cgroup's quota (at least 1)."""
    count = len(affinity() or []) or os.cpu_count() or 1
    quota = quota_cpus()
    return max(1, min(count, quota) if quota is not None else count)
