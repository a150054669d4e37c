"""The hazard table: well-formed, consistent with the patches, versions decided in one place."""

from __future__ import annotations

import sys
import types

import pytest
from packaging.specifiers import SpecifierSet

from tests.conftest import run_python
from tfdet._graph import _hazards, _patching
from tfdet._pin import _versions

FACTS_GPU_TABLE = {
    "Bincount": "raises",
    "DenseBincount": "raises",
    "ResizeNearestNeighborGrad": "raises",
    "CropAndResizeGradImage": "raises",
    "CropAndResizeGradBoxes": "raises",
    "AdjustContrastv2": "raises",
    "MaxPoolGradWithArgmax": "raises",
    "Dilation2DBackpropInput": "raises",
    "Dilation2DBackpropFilter": "raises",
    "SparseTensorDenseMatMul": "raises",
    "FakeQuantWithMinMaxVarsGradient": "raises",
    "FakeQuantWithMinMaxVarsPerChannelGradient": "raises",
    "DebugNumericSummaryV2": "raises",
    "ScatterNd": "host_fallback",
    "TensorScatterAdd": "host_fallback",
    "TensorScatterSub": "host_fallback",
    "TensorScatterUpdate": "host_fallback",
    "ResourceScatterAdd": "host_fallback",
    "ResourceScatterSub": "host_fallback",
    "ResourceScatterUpdate": "host_fallback",
    "ScatterAdd": "raises",
    "Timestamp": "raises",
    "UnsortedSegmentSum": "deterministic",
    "ResizeBilinearGrad": "deterministic",
    "BiasAddGrad": "deterministic",
    "CudnnRNN": "nondeterministic",
}


@pytest.mark.parametrize(("op_type", "behaviour"), sorted(FACTS_GPU_TABLE.items()))
def test_table_has_every_facts_row(op_type: str, behaviour: str) -> None:
    rows = _hazards.table().rows_for(op_type)
    assert rows, f"{op_type} missing from hazards.json"
    assert rows[0].behaviour == behaviour


def test_rows_are_well_formed() -> None:
    table = _hazards.table()
    assert len(table.hazards) >= 15
    for row in table.hazards:
        assert row.behaviour in _hazards.BEHAVIOURS
        assert row.device in ("GPU", "any")
        assert row.ops and row.entry_points and row.upstream.startswith("https://")
        # Covers at least 2.16 through 2.21, the range tfdet supports.
        assert SpecifierSet(row.tensorflow).contains("2.16.0")
        assert SpecifierSet(row.tensorflow).contains("2.21.0")
        assert row.confirmed
    assert "2.16" in table.confirmed_note and "not confirmed" in table.confirmed_note


def test_every_patch_in_the_table_is_registered_and_vice_versa() -> None:
    registered = _patching.available()
    in_rows = {row.patch for row in _hazards.table().hazards if row.patch}
    assert in_rows == set(registered)
    assert set(_hazards.table().patch_requirements) == set(registered)
    for name, patch in registered.items():
        assert patch.upstream.startswith("https://"), name
        # needed() is the table's verdict: one place decides versions.
        assert patch.needed() == _hazards.patch_needed(name)


def test_patches_replace_only_ops_marked_hazardous() -> None:
    for row in _hazards.table().hazards:
        if row.patch:
            assert row.hazardous


@pytest.mark.parametrize(
    ("version", "specifier", "expected"),
    [
        ("2.21.0", ">=2.16", True),
        ("2.16.1", ">=2.16", True),
        ("2.15.1", ">=2.16", False),
        ("2.21.0rc1", ">=2.21", True),  # a release candidate gets its release's rows
        ("2.22.0.dev20260101", ">=2.16,<2.22", False),  # a nightly is its release
        ("2.21.0+nv25.01", ">=2.16", True),
        ("not-a-version", ">=2.16", False),
    ],
)
def test_version_matches(version: str, specifier: str, expected: bool) -> None:
    assert _hazards.version_matches(version, specifier) is expected


def test_lookup_reads_attributes_and_versions() -> None:
    frozen = _hazards.lookup(
        "FusedBatchNormGradV3", {"is_training": False}, tensorflow_version="2.21.0"
    )
    assert frozen is not None and frozen.behaviour == "raises"
    assert frozen.patch == "fused_batch_norm_frozen"
    assert (
        _hazards.lookup(
            "FusedBatchNormGradV3", {"is_training": True}, tensorflow_version="2.21.0"
        )
        is None
    )
    assert (
        _hazards.lookup("ResizeNearestNeighborGrad", tensorflow_version="2.15.0")
        is None
    )
    assert _hazards.lookup("Conv2D", tensorflow_version="2.21.0") is None
    unseeded = _hazards.lookup(
        "RandomUniform", {"seed": 0, "seed2": 0}, tensorflow_version="2.21.0"
    )
    assert unseeded is not None and unseeded.device == "any"
    assert (
        _hazards.lookup(
            "RandomUniform", {"seed": 7, "seed2": 3}, tensorflow_version="2.21.0"
        )
        is None
    )
    compiled = _hazards.lookup("MaxPoolGrad", tensorflow_version="2.21.0", xla=True)
    assert compiled is not None and compiled.behaviour == "xla_compile_error"
    plain = _hazards.lookup("MaxPoolGrad", tensorflow_version="2.21.0", xla=False)
    assert plain is not None and not plain.hazardous


def test_patch_needed_follows_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    assert _hazards.patch_needed("resize_nearest_grad")
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.15.0")
    )
    assert not _hazards.patch_needed("resize_nearest_grad")
    monkeypatch.setattr(_versions, "tensorflow_distribution", lambda: None)
    assert not _hazards.patch_needed("bincount")


def test_tf_keras_patch_needs_tf_keras_installed_not_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whether tf_keras is imported yet, or TF_USE_LEGACY_KERAS set, must not
    # matter: the profile would then depend on import order.
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    monkeypatch.setattr(
        _versions, "distribution_version", lambda name: {"tf_keras": "2.21.0"}.get(name)
    )
    monkeypatch.setattr(_hazards, "_tf_keras_importable", lambda: True)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    for legacy in ("0", "1"):
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
        assert _hazards.patch_needed("sparse_optimizer_update")
    monkeypatch.setitem(sys.modules, "tf_keras", types.ModuleType("tf_keras"))
    assert _hazards.patch_needed("sparse_optimizer_update")
    monkeypatch.setattr(_hazards, "_tf_keras_importable", lambda: False)
    assert not _hazards.patch_needed("sparse_optimizer_update")
    monkeypatch.setattr(_hazards, "_tf_keras_importable", lambda: True)
    monkeypatch.setattr(_versions, "distribution_version", lambda name: None)
    assert not _hazards.patch_needed("sparse_optimizer_update")


def test_importing_the_patches_does_not_import_tensorflow() -> None:
    result = run_python(
        """
        import sys
        from tfdet._graph import _patching, _hazards
        names = sorted(_patching.available())
        _hazards.table()
        print(names, "tensorflow" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")
