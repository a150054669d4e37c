"""The GPU hazard table, and the one place that decides versions for it.

`hazards.json` (package data) lists the ops that TensorFlow refuses, moves to
the host, or runs nondeterministically on GPU under op determinism (and the
CPU ops whose bits depend on the CPU model or on the thread-pool size), which
TensorFlow versions each row applies to and the Keras entry points that reach
it: facts about TensorFlow only. Which tfdet patch replaces an op is declared
by the patch (`tfdet._patching._registry`). `tfdet scan` matches traced ops
against the table; each patch's `needed()` asks `needs_patch()` here whether
the running TensorFlow has a hazard for its ops. Nothing in this module
imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tfdet._pin import _versions

RAISES = "raises"
HOST_FALLBACK = "host_fallback"
NONDETERMINISTIC = "nondeterministic"
XLA_COMPILE_ERROR = "xla_compile_error"
# Device "CPU": the kernel's bits depend on the CPU model (approximate x86
# instructions), so a run is reproducible on one machine but not portable.
MACHINE_DEPENDENT = "machine_dependent"
DETERMINISTIC = "deterministic"
# Device "CPU": the kernel's bits follow the thread-pool size. Not a hazard
# on one machine (the profile records the pool size), but the default
# profile runs a pool of every CPU and promises the bits of one thread, so
# a patch that replaces these ops is installed by default.
POOL_SIZE_DEPENDENT = "pool_size_dependent"
# Device "CPU": the kernel's bits differ between x86-64 and aarch64 (Eigen's
# multiply-adds fused on one, not the other; its packet widths). Not a
# hazard on one machine; the default profile promises the bits across
# architectures where tfdet covers the ops, so it replaces them by default.
ARCHITECTURE_DEPENDENT = "architecture_dependent"
# The kernel's bits follow the executor's schedule (which ops ran side by
# side). Not a hazard under one inter-op thread, where the schedule repeats;
# the default profile runs more, so its patch is installed by default.
SCHEDULE_DEPENDENT = "schedule_dependent"

# Behaviours that make an op a hazard.
HAZARDOUS = frozenset(
    {RAISES, HOST_FALLBACK, NONDETERMINISTIC, XLA_COMPILE_ERROR, MACHINE_DEPENDENT}
)
BEHAVIOURS = HAZARDOUS | {
    DETERMINISTIC,
    POOL_SIZE_DEPENDENT,
    SCHEDULE_DEPENDENT,
    ARCHITECTURE_DEPENDENT,
}
# Behaviours whose ops "auto" replaces: the hazards, and the bits that follow
# the pools, which the default's pools of every CPU would otherwise show.
PATCHED_BY_DEFAULT = HAZARDOUS | {
    POOL_SIZE_DEPENDENT,
    SCHEDULE_DEPENDENT,
    ARCHITECTURE_DEPENDENT,
}

# Pseudo-attribute in `when`: the node is inside an XLA-compiled function.
XLA_CONDITION = "_xla"


@dataclasses.dataclass(frozen=True)
class Hazard:
    """One row of the hazard table.

    Attributes:
        ops: TensorFlow op types the row covers.
        device: "GPU", "CPU", or "any" when every device behaves so.
        behaviour: One of `BEHAVIOURS`.
        detail: What happens, one sentence.
        tensorflow: PEP 440 specifier of the TensorFlow versions it applies to.
        confirmed: Which of those versions were checked, and how.
        entry_points: Keras / TensorFlow APIs that reach the op.
        upstream: Upstream issue or pull request.
        when: Node attributes the row requires (e.g. `is_training: False`).
    """

    ops: tuple[str, ...]
    device: str
    behaviour: str
    detail: str
    tensorflow: str
    confirmed: str
    entry_points: tuple[str, ...]
    upstream: str
    when: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def hazardous(self) -> bool:
        """Whether the row describes a hazard (not a known-deterministic op)."""
        return self.behaviour in HAZARDOUS

    def applies_to(self, tensorflow_version: str) -> bool:
        """Whether the row holds for `tensorflow_version`."""
        return version_matches(tensorflow_version, self.tensorflow)

    def matches(self, attrs: Mapping[str, Any], xla: bool = False) -> bool:
        """Whether a node with these attributes meets the row's `when`."""
        for key, wanted in self.when.items():
            found = xla if key == XLA_CONDITION else attrs.get(key)
            if found != wanted:
                return False
        return True


@dataclasses.dataclass(frozen=True)
class Table:
    """The hazard table."""

    hazards: tuple[Hazard, ...]
    confirmed_note: str

    def rows_for(self, op_type: str) -> tuple[Hazard, ...]:
        """Rows naming `op_type`, in table order."""
        return tuple(row for row in self.hazards if op_type in row.ops)


def version_matches(version: str, specifier: str) -> bool:
    """Whether `version` satisfies the PEP 440 `specifier`.

    Pre-releases and local builds ("2.21.0rc1", "2.21.0+nv") count as their
    release, so nightly and vendor builds get the rows of their version.
    """
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    release = Version(parsed.base_version)
    return SpecifierSet(specifier).contains(release, prereleases=True)


def _parse_row(raw: Mapping[str, Any]) -> Hazard:
    behaviour = raw["behaviour"]
    if behaviour not in BEHAVIOURS:
        raise ValueError(
            f"Expected a hazard behaviour in {sorted(BEHAVIOURS)}. "
            f"Received: behaviour={behaviour!r} for ops {raw['ops']}"
        )
    SpecifierSet(raw["tensorflow"])  # Fails loudly on a malformed table.
    return Hazard(
        ops=tuple(raw["ops"]),
        device=raw["device"],
        behaviour=behaviour,
        detail=raw["detail"],
        tensorflow=raw["tensorflow"],
        confirmed=raw["confirmed"],
        entry_points=tuple(raw["entry_points"]),
        upstream=raw["upstream"],
        when=dict(raw.get("when", {})),
    )


@functools.lru_cache(maxsize=1)
def table() -> Table:
    """The hazard table shipped with tfdet (parsed once)."""
    text = (
        resources.files("tfdet._patching")
        .joinpath("hazards.json")
        .read_text(encoding="utf-8")
    )
    raw = json.loads(text)
    return Table(
        hazards=tuple(_parse_row(row) for row in raw["hazards"]),
        confirmed_note=raw["confirmed_note"],
    )


def lookup(
    op_type: str,
    attrs: Mapping[str, Any] | None = None,
    *,
    tensorflow_version: str | None = None,
    xla: bool = False,
) -> Hazard | None:
    """The first table row that holds for this node, or None.

    Args:
        op_type: The node's op type, e.g. "ResizeNearestNeighborGrad".
        attrs: The node's attributes (only those named in `when` are read).
        tensorflow_version: Version to check rows against; the installed one
            when None.
        xla: Whether the node is inside an XLA-compiled function.
    """
    version = tensorflow_version or _versions.tensorflow_version()
    for row in table().rows_for(op_type):
        if row.applies_to(version) and row.matches(attrs or {}, xla):
            return row
    return None


def needs_patch(op_types: tuple[str, ...] | list[str], tensorflow_version: str) -> bool:
    """Whether a row that "auto" answers (`PATCHED_BY_DEFAULT`) holds for one
    of `op_types` at that version.

    Rows' `when` conditions are not read: an op is counted when any of its
    nodes can be a hazard (a frozen fused batch norm's gradient, say).
    """
    rows = (row for op_type in op_types for row in table().rows_for(op_type))
    return any(
        row.behaviour in PATCHED_BY_DEFAULT and row.applies_to(tensorflow_version)
        for row in rows
    )


def with_behaviour(
    op_types: Iterable[str], behaviour: str, tensorflow_version: str
) -> tuple[str, ...]:
    """Those of `op_types` that a CPU row of `behaviour` names at that
    version, sorted (rows' `when` conditions are not read)."""
    named = {
        op_type
        for row in table().hazards
        if row.behaviour == behaviour and row.applies_to(tensorflow_version)
        for op_type in row.ops
    }
    return tuple(sorted(named.intersection(op_types)))


def pool_size_dependent(
    op_types: Iterable[str], tensorflow_version: str
) -> tuple[str, ...]:
    """Those of `op_types` whose CPU bits follow the thread-pool size, sorted."""
    return with_behaviour(op_types, POOL_SIZE_DEPENDENT, tensorflow_version)
