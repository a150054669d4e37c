"""The settings every entry point pins, their defaults and their validation.

`tfdet.enable()`, `tfdet run`, `tfdet scan` and the options of `tfdet check`
and `tfdet locate` take the same seed, thread count and oneDNN ISA cap. The
defaults and the accepted values are stated here once; everything else
imports them. This module imports nothing that starts TensorFlow.
"""

from __future__ import annotations

import operator
from typing import Any

from tfdet._pin import _arm, _cpus, _isa

DEFAULT_SEED = 0
MAX_SEED = 2**32 - 1
# None: all the CPUs the process may use (`_cpus.usable_cpus()`), decided
# where the process runs. Under the default patches (tfdet's fixed-order
# kernels) the pool size decides no bit on x86-64, so every count gives the
# bits of one thread; the count is the speed. On aarch64, one thread: there
# the pool still decided bits (an emulated aarch64 check of a Dense model
# under this default, pools of 2 and 1: other weights at step 0, 2026-12-07).
DEFAULT_THREADS = None
# Far above any core count, far below what makes TensorFlow's thread creation
# abort the process (pthread_create fails fatally somewhere past ~10 000).
MAX_THREADS = 1024
# AVX2: the bits of every x86-64 CPU generation from Haswell on.
DEFAULT_CPU_ISA = "AVX2"
# oneDNN custom ops: pinned, on on x86-64 and off on aarch64. Left to
# TensorFlow, the choice follows the CPU and decides the bits.
# - x86-64: 2.21 turns them on only where it finds AVX-512 VNNI/BF16 or AMX;
#   one CPU model exposing AVX-512 BF16 and the same model exposing AVX2 only
#   train to other weights under the AVX2 cap, to the same ones once both run
#   with oneDNN on. On is also TensorFlow's choice on current server CPUs, and
#   the faster one.
# - aarch64: the wheel's oneDNN picks JIT kernels by the SVE vector length
#   (`brg:sve_512`, `sve_256`, NEON below), and TensorFlow turns it on only on
#   a Neoverse V1 (Graviton3). Measured in emulated aarch64 processes (QEMU
#   7.2, TensorFlow 2.21): a Conv2D + BatchNormalization + GELU model trained
#   to other weights on an SVE-512 CPU model than on a Neoverse N1 with oneDNN
#   on, to the same ones with it off (Eigen's NEON kernels: 4-float vectors
#   on every aarch64 CPU).
DEFAULT_ONEDNN = not _arm.applies()


def check_int(name: str, value: Any, low: int, high: int | None) -> int:
    """`value` as a Python int in `[low, high]` (`high` None: no upper bound).

    Any integer type (int, `numpy.int64`, ...) is accepted and returned as a
    Python int, so that profiles stay JSON-ready; bool, float and str are not.

    Raises:
        ValueError: naming `name`, the accepted range and the value received.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(
            f"Expected `{name}` to be an int. Received: {name}={value!r} "
            f"(of type {type(value).__name__})"
        ) from None
    if value < low or (high is not None and value > high):
        accepted = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"Expected `{name}` {accepted}. Received: {name}={value}")
    return value


def check_seed(seed: Any) -> int:
    """The seed as an int in `[0, MAX_SEED]`; ValueError otherwise."""
    return check_int("seed", seed, 0, MAX_SEED)


def check_threads(threads: Any) -> int | None:
    """The thread count as an int in `[1, MAX_THREADS]`, or None (the
    default: the CPUs of the process that runs); ValueError otherwise."""
    if threads is None:
        return None
    return check_int("threads", threads, 1, MAX_THREADS)


def threads_here(threads: int | None) -> int:
    """The pool size `threads` asks for in this process: None, the CPUs it
    may use (capped at `MAX_THREADS`; one on aarch64, see `DEFAULT_THREADS`)."""
    if threads is None:
        return 1 if _arm.applies() else min(_cpus.usable_cpus(), MAX_THREADS)
    return threads


def check_isa_supported(cpu_isa: str | None) -> str | None:
    """Normalizes `cpu_isa` and checks this CPU has it (x86-64 only).

    Raises:
        ValueError: not a oneDNN ISA name, or the CPU lacks it; the message
            names the best level this CPU supports.
    """
    if cpu_isa is None:
        return None
    wanted = _isa.normalize(cpu_isa)
    if _isa.applies() and not _isa.supports(wanted):
        best = _isa.best_supported()
        raise ValueError(
            f"Expected a `cpu_isa` this CPU supports (up to {best}). Received: "
            f"cpu_isa={cpu_isa!r}. Pass cpu_isa={best!r} or lower; the bits "
            "will then match machines pinned at that level."
        )
    return wanted


def check_settings(
    seed: Any, threads: Any, cpu_isa: str | None
) -> tuple[int, int | None, str | None]:
    """Validates the three pinned settings together, as `enable()` does.

    Returns:
        `(seed, threads, cpu_isa)` normalized (ints, canonical ISA name).

    Raises:
        ValueError: naming the first bad setting and the accepted values.
    """
    return check_seed(seed), check_threads(threads), check_isa_supported(cpu_isa)
