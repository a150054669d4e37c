"""oneDNN instruction-set caps (`ONEDNN_MAX_CPU_ISA`) and what this CPU has.

oneDNN picks its kernels, and so the order of floating-point operations, from
the best ISA the CPU offers: on x86-64 the bits change with the ISA even with
TensorFlow's oneDNN custom ops off, because Eigen's contraction kernel also
goes through oneDNN. Capping the ISA at a level most x86-64 machines have
(AVX2) removes that one cause of difference between CPU generations; it does
not make every model's bits portable on its own (capped, an AMD and an Intel
CPU still differed in the approximate instructions, which the portable
patches replace).

XLA:CPU generates its own code for the host's ISA, so the same cap is also
given to XLA (`--xla_cpu_max_isa`, its coarser names): XLA's generated
element-wise code (`x * 1.7 + 0.3`, GELU, softmax) changes bits between caps
AVX and AVX2 (FMA contraction).
"""

from __future__ import annotations

import os
import platform

from tfdet import _cpuinfo
from tfdet._pin import _versions

ONEDNN_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
NOT_APPLICABLE = "not applicable"

# oneDNN's values, lowest first, with the /proc/cpuinfo flags each one needs.
_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("SSE41", frozenset({"sse4_1"})),
    ("AVX", frozenset({"avx"})),
    ("AVX2", frozenset({"avx2"})),
    ("AVX2_VNNI", frozenset({"avx2", "avx_vnni"})),
    ("AVX2_VNNI_2", frozenset({"avx2", "avx_vnni", "avx_vnni_int8"})),
    ("AVX512_CORE", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})),
    (
        "AVX512_CORE_VNNI",
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}),
    ),
    (
        "AVX512_CORE_BF16",
        frozenset(
            {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
            | {"avx512_bf16"}
        ),
    ),
    (
        "AVX10_1_512",
        frozenset(
            {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
            | {"avx512_bf16", "avx512_fp16"}
        ),
    ),
    (
        "AVX10_1_512_AMX",
        frozenset(
            {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
            | {"avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}
        ),
    ),
    (
        "AVX10_1_512_AMX_FP16",
        frozenset(
            {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
            | {"avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}
            | {"amx_fp16"}
        ),
    ),
    ("ALL", frozenset()),
)
_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
}
NAMES: tuple[str, ...] = tuple(name for name, _ in _LEVELS)
# XLA:CPU's `--xla_cpu_max_isa` values, lowest first, and the one each oneDNN
# cap maps to: the highest XLA level the cap allows (XLA has no SSE4.1 level;
# SSE4.2 adds no floating-point instruction). "ALL" sets no XLA cap.
XLA_FLAG = "--xla_cpu_max_isa"
XLA_NAMES: tuple[str, ...] = (
    "SSE4_2",
    "AVX",
    "AVX2",
    "AVX512",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX",
    "AMX_FP16",
)
_XLA_CAP = {
    "SSE41": "SSE4_2",
    "AVX": "AVX",
    "AVX2": "AVX2",
    "AVX2_VNNI": "AVX2",
    "AVX2_VNNI_2": "AVX2",
    "AVX512_CORE": "AVX512",
    "AVX512_CORE_VNNI": "AVX512_VNNI",
    "AVX512_CORE_BF16": "AVX512_BF16",
    "AVX10_1_512": "AVX512_BF16",
    "AVX10_1_512_AMX": "AMX",
    "AVX10_1_512_AMX_FP16": "AMX_FP16",
}
_RANK = {name: rank for rank, name in enumerate(NAMES)}
_REQUIRED = dict(_LEVELS)


def applies() -> bool:
    """Whether oneDNN ISA caps mean anything on this machine (x86-64 only)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def normalize(name: str) -> str:
    """Canonical upper-case oneDNN name for `name`.

    Raises:
        ValueError: `name` is not a oneDNN ISA, listing the accepted names.
    """
    if not isinstance(name, str):
        raise ValueError(
            f"Expected `cpu_isa` to be a string, one of {', '.join(NAMES)}. "
            f"Received: cpu_isa={name!r}"
        )
    upper = name.strip().upper()
    upper = _ALIASES.get(upper, upper)
    if upper not in _RANK:
        raise ValueError(
            f"Expected `cpu_isa` to be one of {', '.join(NAMES)}. "
            f"Received: cpu_isa={name!r}"
        )
    return upper


def rank(name: str) -> int:
    """Position of a canonical name, lowest ISA first."""
    return _RANK[normalize(name)]


def flags_allowed(cap: str) -> frozenset[str] | None:
    """The /proc/cpuinfo extension flags of every level up to `cap`.

    None for "ALL" (no cap: every flag is allowed).
    """
    cap = normalize(cap)
    if cap == "ALL":
        return None
    return frozenset().union(*(_REQUIRED[name] for name in NAMES[: rank(cap) + 1]))


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where unavailable)."""
    return _cpuinfo.flags()


def cpu_model() -> str:
    """The CPU model name, or the platform's processor string."""
    model = _cpuinfo.fields(("model name",)).get("model name")
    return model or platform.processor() or platform.machine()


def best_supported(flags: frozenset[str] | None = None) -> str:
    """The highest capped level the CPU fully supports (never `"ALL"`)."""
    flags = cpu_flags() if flags is None else flags
    best = NAMES[0]
    for name, required in _LEVELS[:-1]:
        if required <= flags:
            best = name
    return best


def supports(name: str, flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU has every instruction `name` needs."""
    flags = cpu_flags() if flags is None else flags
    if not flags:  # Unknown CPU (no /proc/cpuinfo): trust the request.
        return True
    return _REQUIRED[normalize(name)] <= flags


def relevant_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The CPU flags that decide oneDNN's kernel choice, sorted."""
    flags = cpu_flags() if flags is None else flags
    wanted = frozenset().union(*_REQUIRED.values())
    return sorted(flags & wanted)


def with_xla_cap(xla_flags: str, cap: str | None) -> str:
    """`xla_flags` with XLA:CPU capped at the level of the oneDNN `cap`.

    As for oneDNN, a lower XLA cap already in the flags is kept (the
    machine's ceiling) and a higher one is replaced; other flags are kept in
    order. XLA reads `XLA_FLAGS` at its first compilation in a process. A
    TensorFlow whose XLA has no such flag (before 2.19) gets the flags
    unchanged: it would abort on it (`xla_cap_in_force` says so).

    Args:
        xla_flags: The current value of `XLA_FLAGS`.
        cap: A oneDNN cap name; None or "ALL" leaves the flags unchanged.
    """
    wanted = None if cap is None else _XLA_CAP.get(normalize(cap))
    if wanted is None or not _versions.xla_cpu_isa_cap_known():
        return xla_flags
    parts = xla_flags.split()
    prefix = XLA_FLAG + "="
    existing = [part for part in parts if part.startswith(prefix)]
    if existing:
        value = existing[-1][len(prefix) :].upper()
        if value in XLA_NAMES and XLA_NAMES.index(value) <= XLA_NAMES.index(wanted):
            return xla_flags
        parts = [part for part in parts if not part.startswith(prefix)]
    return " ".join([*parts, prefix + wanted])


def xla_cap_in_force(xla_flags: str | None = None) -> str:
    """XLA:CPU's ISA cap as the profile records it.

    Args:
        xla_flags: `XLA_FLAGS`; None reads the environment.

    Returns:
        The `--xla_cpu_max_isa` value in the flags; "none" without one; a
        "none (...)" sentence where the installed TensorFlow has no such flag;
        `NOT_APPLICABLE` off x86-64.
    """
    if not applies():
        return NOT_APPLICABLE
    if not _versions.xla_cpu_isa_cap_known():
        installed = _versions.tensorflow_distribution()
        return (
            f"none (TensorFlow {installed[1] if installed else '(none)'} has no "
            f"{XLA_FLAG}, added in {_versions.XLA_CPU_ISA_CAP_SINCE}: XLA-compiled "
            "code uses this CPU's best instructions)"
        )
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    prefix = XLA_FLAG + "="
    values = [part[len(prefix) :] for part in flags.split() if part.startswith(prefix)]
    return values[-1].upper() if values else "none"


def current_cap() -> str | None:
    """The cap set in the environment, canonical, or None when unset/unknown."""
    value = os.environ.get(ONEDNN_ISA_VARIABLE)
    if not value:
        return None
    try:
        return normalize(value)
    except ValueError:
        return None


def in_force(cap: str | None = None, flags: frozenset[str] | None = None) -> str | None:
    """The ISA oneDNN may use here: the lower of the cap and the CPU's best.

    Args:
        cap: A oneDNN cap name; None reads `ONEDNN_MAX_CPU_ISA` (unset or
            unknown: no cap, the CPU's best is in force).
        flags: CPU flags; None reads /proc/cpuinfo.

    Returns:
        A canonical name, or None off x86-64 (no oneDNN ISA levels there).
    """
    if not applies():
        return None
    best = best_supported(flags)
    cap = current_cap() if cap is None else normalize(cap)
    if cap is None or cap == "ALL" or rank(cap) >= rank(best):
        return best
    return cap
