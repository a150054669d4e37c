"""The hazard table: well-formed facts about TensorFlow ops, matched by op, attributes and version."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from packaging.specifiers import SpecifierSet

from tests.conftest import ci_module, run_python
from tfdet._patching import _hazards

MEASURED_GPU_TABLE = {
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
    "CudnnRNN": "deterministic",
}


@pytest.mark.parametrize(("op_type", "behaviour"), sorted(MEASURED_GPU_TABLE.items()))
def test_table_has_every_facts_row(op_type: str, behaviour: str) -> None:
    rows = _hazards.table().rows_for(op_type)
    assert rows, f"{op_type} missing from hazards.json"
    assert rows[0].behaviour == behaviour


# The TensorFlow releases tfdet supports, oldest first (the version matrix's).
SUPPORTED = tuple(f"{minor}.0" for minor in ci_module("matrix").MINORS)


def test_rows_are_well_formed() -> None:
    table = _hazards.table()
    assert len(table.hazards) >= 15
    for row in table.hazards:
        assert row.behaviour in _hazards.BEHAVIOURS
        assert row.device in ("GPU", "CPU", "any")
        assert row.ops and row.entry_points and row.upstream.startswith("https://")
        # Covers every supported TensorFlow from where it starts to the
        # newest: 2.16, unless a kernel changed later (Erfc's in 2.20), and
        # then its `confirmed` names the version it starts at.
        covered = [v for v in SUPPORTED if SpecifierSet(row.tensorflow).contains(v)]
        assert covered == list(SUPPORTED[SUPPORTED.index(covered[0]) :]), row
        assert covered[0] == SUPPORTED[0] or covered[0][:-2] in row.confirmed, row
        assert row.confirmed
    assert "2.16" in table.confirmed_note and "not confirmed" in table.confirmed_note


def test_the_table_holds_no_patch_names() -> None:
    # Which patch replaces an op is the patch's declaration, not the table's.
    raw = json.loads(
        resources.files("tfdet._patching").joinpath("hazards.json").read_text("utf-8")
    )
    assert set(raw) == {"about", "confirmed_note", "hazards"}
    for row in raw["hazards"]:
        assert "patch" not in row, row["ops"]


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


@pytest.mark.parametrize(
    ("op_types", "version", "expected"),
    [
        (("ResizeNearestNeighborGrad",), "2.21.0", True),
        (("ResizeNearestNeighborGrad",), "2.15.0", False),  # rows start at 2.16
        (("Conv2D", "Bincount"), "2.21.0", True),  # one hazardous op is enough
        (("Conv2D",), "2.21.0", False),  # not in the table
        (("UnsortedSegmentSum",), "2.21.0", False),  # a deterministic row
        (("BiasAddGrad",), "2.21.0", True),  # follows the pool size
        # Counted although its row holds only for is_training=False nodes.
        (("FusedBatchNormGradV3",), "2.21.0", True),
        ((), "2.21.0", False),
    ],
)
def test_needs_patch(op_types, version: str, expected: bool) -> None:
    assert _hazards.needs_patch(op_types, version) is expected


def test_importing_the_patches_does_not_import_tensorflow() -> None:
    result = run_python(
        """
        import sys
        from tfdet._patching import _registry
        from tfdet._patching import _hazards
        names = sorted(_registry.available())
        _hazards.table()
        print(names, "tensorflow" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")


def test_pool_size_dependent_names_the_ops_whose_cpu_bits_follow_the_pool_size():
    found = _hazards.pool_size_dependent(
        {"MatMul", "Relu", "BiasAddGrad", "Sum", "Einsum"}, "2.21.0"
    )
    assert found == ("BiasAddGrad", "Einsum", "MatMul")
    # Not a hazard (scan does not flag them on one machine), but the
    # default's pools of every CPU would show them: "auto" answers them.
    assert not any(
        _hazards.lookup(op, tensorflow_version="2.21.0").hazardous
        for op in ("MatMul", "Einsum")
    )
    assert _hazards.needs_patch(["MatMul", "Einsum"], "2.21.0")
    assert _hazards.needs_patch(["AddN"], "2.21.0")  # follows the schedule
