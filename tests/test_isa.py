"""oneDNN ISA levels: what this CPU has and what is in force under a cap."""

from __future__ import annotations

import pytest

from tfdet._pin import _isa

AVX512_SERVER = frozenset(
    {"sse4_1", "avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
)
AVX2_LAPTOP = frozenset({"sse4_1", "avx", "avx2"})


def test_best_supported_follows_the_flags() -> None:
    assert _isa.best_supported(AVX512_SERVER) == "AVX512_CORE"
    assert _isa.best_supported(AVX2_LAPTOP) == "AVX2"


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA levels are x86-64 only")
@pytest.mark.parametrize(
    ("cap", "flags", "expected"),
    [
        ("AVX2", AVX512_SERVER, "AVX2"),  # The cap holds the server down.
        ("avx512_core", AVX2_LAPTOP, "AVX2"),  # A cap above the CPU: its best.
        ("ALL", AVX512_SERVER, "AVX512_CORE"),
    ],
)
def test_in_force_is_the_lower_of_cap_and_cpu(
    cap: str, flags: frozenset[str], expected: str
) -> None:
    assert _isa.in_force(cap, flags) == expected


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA levels are x86-64 only")
def test_in_force_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_isa.ENV_VAR, "AVX2")
    assert _isa.in_force(flags=AVX512_SERVER) == "AVX2"
    monkeypatch.delenv(_isa.ENV_VAR)
    assert _isa.in_force(flags=AVX512_SERVER) == "AVX512_CORE"


def test_unknown_cap_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="Received: cpu_isa='AVX9'"):
        _isa.normalize("AVX9")
