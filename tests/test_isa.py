"""oneDNN ISA levels: what this CPU has and what is in force under a cap."""

from __future__ import annotations

import pytest

from tfdet._pin import _isa, _versions

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
    monkeypatch.setenv(_isa.ONEDNN_ISA_VARIABLE, "AVX2")
    assert _isa.in_force(flags=AVX512_SERVER) == "AVX2"
    monkeypatch.delenv(_isa.ONEDNN_ISA_VARIABLE)
    assert _isa.in_force(flags=AVX512_SERVER) == "AVX512_CORE"


def test_unknown_cap_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="Received: cpu_isa='AVX9'"):
        _isa.normalize("AVX9")


@pytest.mark.parametrize(
    ("flags", "cap", "expected"),
    [
        ("", "AVX2", "--xla_cpu_max_isa=AVX2"),
        (
            "--xla_gpu_deterministic_ops=true",
            "avx512_core",
            ("--xla_gpu_deterministic_ops=true --xla_cpu_max_isa=AVX512"),
        ),
        ("", "SSE41", "--xla_cpu_max_isa=SSE4_2"),  # XLA's lowest level.
        ("", "AVX10_1_512_AMX", "--xla_cpu_max_isa=AMX"),
        # Uncapped, or no cap: the flags are left alone.
        ("--a=1", "ALL", "--a=1"),
        ("--a=1", None, "--a=1"),
        # A lower XLA cap already set is the machine's ceiling: kept.
        ("--xla_cpu_max_isa=AVX --a=1", "AVX2", "--xla_cpu_max_isa=AVX --a=1"),
        ("--xla_cpu_max_isa=AVX2", "AVX2", "--xla_cpu_max_isa=AVX2"),
        # A higher (or unknown) one is replaced, other flags kept in order.
        ("--xla_cpu_max_isa=AMX --a=1", "AVX2", "--a=1 --xla_cpu_max_isa=AVX2"),
        ("--xla_cpu_max_isa=bogus", "AVX2", "--xla_cpu_max_isa=AVX2"),
    ],
)
def test_xla_gets_the_onednn_cap(flags: str, cap: str | None, expected: str) -> None:
    assert _isa.with_xla_cap(flags, cap) == expected


def test_every_capped_onednn_level_has_an_xla_level() -> None:
    for name in _isa.NAMES[:-1]:
        assert _isa.with_xla_cap("", name).startswith(_isa.XLA_FLAG + "=")
    with pytest.raises(ValueError, match="cpu_isa"):
        _isa.with_xla_cap("", "AVX3")


@pytest.mark.parametrize(
    ("version", "known"),
    [("2.16.2", False), ("2.18.1", False), ("2.19.0", True), ("2.21.0", True)],
)
def test_the_xla_cap_is_written_only_where_xla_knows_it(
    monkeypatch: pytest.MonkeyPatch, version: str, known: bool
) -> None:
    # XLA before TensorFlow 2.19 aborts the process on `--xla_cpu_max_isa`
    # (measured on 2.16-2.18): the flags stay as they are there, and the
    # profile says why XLA:CPU is not capped.
    if not _isa.applies():
        pytest.skip("XLA:CPU ISA caps are x86-64 only")
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow-cpu", version)
    )
    flags = _isa.with_xla_cap("--xla_gpu_deterministic_ops=true", "AVX2")
    in_force = _isa.xla_cap_in_force(flags)
    if known:
        assert flags.split()[-1] == "--xla_cpu_max_isa=AVX2"
        assert in_force == "AVX2"
    else:
        assert flags == "--xla_gpu_deterministic_ops=true"
        assert in_force.startswith(f"none (TensorFlow {version} has no")
