"""`_pin._arm`: what an aarch64 CPU offers, from the auxiliary vector.

The facts are read the way a real aarch64 process reads them; these tests
feed the readers the bytes and text of real and emulated machines, so they
run on any architecture. `ci/aarch64.py` runs the suite's aarch64 part in
an emulated aarch64 process.
"""

from __future__ import annotations

import struct

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
