"""CPU facts of the environment fingerprint, and comparing two machines' facts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tfdet._pin import _environment


def _fake_sysfs(root: Path, caches: list[tuple[str, str, str, str]]) -> None:
    for index, (level, kind, size, shared) in enumerate(caches):
        directory = root / "cpu0" / "cache" / f"index{index}"
        directory.mkdir(parents=True)
        (directory / "level").write_text(level + "\n")
        (directory / "type").write_text(kind + "\n")
        (directory / "size").write_text(size + "\n")
        (directory / "shared_cpu_list").write_text(shared + "\n")


def test_cpu_caches_reads_every_level_from_sysfs(tmp_path: Path) -> None:
    # The Intel Xeon Sapphire Rapids of the measurement: 48K L1d, 2M L2, 300M L3.
    _fake_sysfs(
        tmp_path,
        [
            ("1", "Data", "48K", "0,8"),
            ("1", "Instruction", "32K", "0,8"),
            ("2", "Unified", "2048K", "0,8"),
            ("3", "Unified", "307200K", "0-15"),
        ],
    )
    sizes, sharing = _environment.cpu_caches(str(tmp_path))
    assert sizes == ["L1d=48K", "L1i=32K", "L2=2048K", "L3=307200K"]
    assert sharing == ["L1d:0,8", "L1i:0,8", "L2:0,8", "L3:0-15"]


def test_cpu_caches_falls_back_to_sysconf_without_sysfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"SC_LEVEL1_DCACHE_SIZE": 32768, "SC_LEVEL2_CACHE_SIZE": 1 << 20}
    monkeypatch.setattr(os, "sysconf", lambda name: values.get(name, 0))
    sizes, sharing = _environment.cpu_caches(str(tmp_path / "missing"))
    assert sizes == ["L1d=32K", "L2=1024K"]
    assert sharing == []


@pytest.mark.skipif(
    not os.path.isdir("/sys/devices/system/cpu/cpu0/cache/index0"),
    reason="no sysfs cache directory on this machine",
)
def test_fingerprint_records_this_machines_cpu_facts() -> None:
    facts = _environment.fingerprint(include_tensorflow=False)
    level = Path("/sys/devices/system/cpu/cpu0/cache/index0")
    first = f"L{level.joinpath('level').read_text().strip()}"
    assert facts["cpu_caches"][0].startswith(first)
    assert facts["cpu_caches"][0].endswith(level.joinpath("size").read_text().strip())
    assert facts["cpu_vendor"]
    assert facts["cpu_count"] == os.cpu_count()
    json.dumps(facts)


def _machine(**overrides: object) -> dict[str, object]:
    facts: dict[str, object] = {
        "cpu_vendor": "AuthenticAMD",
        "cpu_model": "AMD EPYC",
        "cpu_family": "25",
        "cpu_model_number": "17",
        "cpu_stepping": "1",
        "cpu_caches": ["L1d=32K", "L1i=32K", "L2=1024K", "L3=32768K"],
        "cpu_cache_sharing": ["L1d:0", "L1i:0", "L2:0", "L3:0-1"],
        "cpu_count": 2,
        "cpu_isa_flags": ["avx", "avx2", "avx512f"],
        "cpu_isa_in_force": "AVX2",
        "cpu_isa_best": "AVX512_CORE_BF16",
        "profile": {"seed": 7, "intra_op_threads": 1},
    }
    facts.update(overrides)
    return facts


def test_compare_cpus_is_empty_for_the_same_cpu() -> None:
    assert _environment.compare_cpus(_machine(), _machine()) == {}


def test_compare_cpus_says_which_differences_change_bits() -> None:
    intel = _machine(
        cpu_vendor="GenuineIntel",
        cpu_model="Intel(R) Xeon(R) Platinum 8481C",
        cpu_family="6",
        cpu_model_number="143",
        cpu_caches=["L1d=48K", "L1i=32K", "L2=2048K", "L3=307200K"],
        cpu_count=16,
        cpu_isa_in_force="AVX512_CORE",
    )
    differences = _environment.compare_cpus(_machine(), intel)
    assert differences["cpu_caches"]["changes_bits"] == "may"
    assert differences["cpu_vendor"]["changes_bits"] == "may"
    assert "approximate instructions" in differences["cpu_vendor"]["why"]
    assert differences["cpu_isa_in_force"]["changes_bits"] == "yes"
    assert differences["cpu_isa_in_force"]["b"] == "AVX512_CORE"
    assert differences["cpu_count"]["changes_bits"] == "no"
    assert "thread-pool size" in differences["cpu_count"]["why"]
    assert "cpu_stepping" not in differences
    # Same best ISA recorded: not reported.
    assert "cpu_isa_best" not in differences


def test_onednn_custom_ops_state_changes_bits() -> None:
    differences = _environment.compare_cpus(
        _machine(onednn_custom_ops=True, cpu_isa_flags=["avx2", "avx512_bf16"]),
        _machine(onednn_custom_ops=False, cpu_isa_flags=["avx2"]),
    )
    assert differences["onednn_custom_ops"]["changes_bits"] == "yes"
    assert "TF_ENABLE_ONEDNN_OPTS" in differences["onednn_custom_ops"]["why"]
    assert differences["cpu_isa_flags"]["changes_bits"] == "may"


def test_core_count_changes_bits_when_tfdet_was_not_enabled() -> None:
    differences = _environment.compare_cpus(
        _machine(profile=None), _machine(cpu_count=16)
    )
    assert differences["cpu_count"]["changes_bits"] == "yes"


def test_compare_cpus_skips_facts_an_old_trace_did_not_record() -> None:
    old = {"cpu_model": "AMD EPYC", "cpu_count": 2, "profile": None}
    differences = _environment.compare_cpus(old, _machine(cpu_model="Other"))
    assert set(differences) == {"cpu_model"}
