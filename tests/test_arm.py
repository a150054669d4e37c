"""`_pin._arm`: what an aarch64 CPU offers, from the auxiliary vector.

The facts are read the way a real aarch64 process reads them; these tests
feed the readers the bytes and text of real and emulated machines, so they
run on any architecture. `ci/aarch64.py` runs the suite's aarch64 part in
an emulated aarch64 process.
"""

from __future__ import annotations

import shutil
import struct

import pytest

from tfdet._pin import _arm

# A Neoverse V1 (Graviton3): asimd, asimdhp, asimddp and sve in AT_HWCAP,
# i8mm and bf16 in AT_HWCAP2 (and bits tfdet does not name).
_V1_HWCAP = 1 << 0 | 1 << 1 | 1 << 10 | 1 << 20 | 1 << 22 | 1 << 7
_V1_HWCAP2 = 1 << 13 | 1 << 14 | 1 << 2


def _auxv_bytes(pairs):
    return b"".join(struct.pack("<QQ", key, value) for key, value in pairs)


def test_features_come_from_the_auxiliary_vector(tmp_path):
    path = tmp_path / "auxv"
    path.write_bytes(
        _auxv_bytes([(6, 4096), (16, _V1_HWCAP), (26, _V1_HWCAP2), (0, 0)])
    )
    auxv = _arm._auxv(str(path))
    assert _arm.features(auxv) == ["asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve"]
    # A Neoverse N1 (Graviton2, Ampere Altra): NEON only.
    assert _arm.features({16: 1 << 1 | 1 << 10 | 1 << 20}) == [
        "asimd",
        "asimddp",
        "asimdhp",
    ]
    assert _arm.features({}) == []
    assert _arm._auxv(str(tmp_path / "missing")) == {}


def test_an_x86_cpuinfo_under_aarch64_is_an_emulator_s_host():
    x86 = {"vendor_id": "AuthenticAMD", "cpu family": "25"}
    arm = {"CPU implementer": "0x41"}
    assert _arm.emulated_on(x86) == "x86-64 (AuthenticAMD)"
    assert _arm.emulated_on(arm) is None


def test_implementer_and_part_are_named_where_known():
    assert _arm.describe({"CPU implementer": "0x41", "CPU part": "0xd40"}) == {
        "vendor": "Arm",
        "model": "Neoverse V1",
    }
    assert _arm.describe({"CPU implementer": "0xc0", "CPU part": "0xac3"}) == {
        "vendor": "Ampere",
        "model": "0xac3",
    }
    assert _arm.describe({}) == {"vendor": None, "model": None}


def _on_aarch64(monkeypatch, vector_unit: str, host_cpuinfo: dict[str, str]) -> None:
    """This process as an aarch64 one: its vector unit, its /proc/cpuinfo."""
    from tfdet._pin import _environment

    monkeypatch.setattr(_arm, "applies", lambda: True)
    monkeypatch.setattr(_arm, "environment_isa", lambda: vector_unit)
    monkeypatch.setattr(_environment, "_cpuinfo_fields", lambda keys: host_cpuinfo)


def test_an_emulated_aarch64_process_runs_another_core_through_its_own_emulator(
    monkeypatch,
):
    from tfdet._protocol import _emulation, _perturb

    # QEMU's `max` (512-bit SVE) on an x86 host, as CI's aarch64 part runs.
    _on_aarch64(monkeypatch, "sve_512", {"vendor_id": "AuthenticAMD"})
    assert _emulation.already_emulated()
    assert _emulation.why_unavailable(None) is None
    # Another vector unit by default; the model reaches the emulator that
    # sys.executable starts, through its variable.
    assert _emulation.default_model() == "neoverse-n1"
    context = _perturb.Context(2, None, 1, None)
    change = _perturb.REGISTRY["emulated_cpu"].change(1, context)
    assert change.launcher == ()
    assert change.env["QEMU_CPU"] == "neoverse-n1"
    assert change.by_child and "neoverse-n1" in change.label


def test_a_real_arm_cpu_puts_qemu_aarch64_in_front_of_the_run(monkeypatch):
    from tfdet._protocol import _emulation

    _on_aarch64(monkeypatch, "asimd", {"CPU implementer": "0x41"})  # Graviton2.
    assert not _emulation.already_emulated()
    assert _emulation.default_model() == "max"
    assert _emulation.launcher("max")[1:] == ("-cpu", "max")
    assert _emulation.launcher("max")[0].endswith("qemu-aarch64")
    assert _emulation.environment("max") == {}


def test_the_run_confirms_the_model_by_its_vector_unit(monkeypatch):
    from tfdet import _variables
    from tfdet._protocol._perturb import emulated_cpu

    _on_aarch64(monkeypatch, "asimd", {"vendor_id": "AuthenticAMD"})
    monkeypatch.setenv(_variables.EMULATED_CPU, "neoverse-n1")
    assert emulated_cpu._in_child() == "vector unit asimd (neoverse-n1, emulated)"
    # Still SVE: the model did not take, and the run must not claim it.
    monkeypatch.setenv(_variables.EMULATED_CPU, "max")
    assert emulated_cpu._in_child() is None


def test_the_models_are_read_from_qemu_aarch64_and_checked(monkeypatch):
    from tfdet._protocol import _emulation

    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 is not installed (apt-get install qemu-user)")
    _on_aarch64(monkeypatch, "asimd", {"CPU implementer": "0x41"})
    assert {"max", "neoverse-n1", "a64fx"} <= set(_emulation.known_models())
    assert _emulation.check_model("a64fx", None) == "a64fx"
    with pytest.raises(ValueError, match="does not know it"):
        _emulation.check_model("Haswell-v4", None)
