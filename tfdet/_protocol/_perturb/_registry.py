"""The perturbations, in order, and what reads them by name.

`REGISTRY` lists each perturbation module's `PERTURBATION` in the order
`--help`, the reference page and the reports use; `ALL` (the default set),
`KNOWN`, the `--perturb` parser and the child's pass over the in-child
perturbations (`applied_in_child`) derive from it. A new perturbation is a
module beside this one, imported here and given its line in `REGISTRY`. The
list is written out, not found with `pkgutil` as the patches are: its order
is part of what users read, where a scan would sort by name.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Mapping, Sequence

from tfdet._protocol._perturb import (
    affinity,
    batch,
    caches,
    emulated_cpu,
    hashseed,
    interrupt,
    isa,
    migrate,
    neighbour,
    stagger,
    threads,
)
from tfdet._protocol._perturb._records import Perturbation

NONE = "none"

REGISTRY: Mapping[str, Perturbation] = types.MappingProxyType(
    {
        record.name: record
        for record in (
            affinity.PERTURBATION,
            isa.PERTURBATION,
            caches.PERTURBATION,
            hashseed.PERTURBATION,
            neighbour.PERTURBATION,
            stagger.PERTURBATION,
            threads.PERTURBATION,
            emulated_cpu.PERTURBATION,
            interrupt.PERTURBATION,
            migrate.PERTURBATION,
            batch.PERTURBATION,
        )
    }
)

# The default set ("all"): what must not change the bits under one profile.
ALL = tuple(name for name, record in REGISTRY.items() if record.default)
KNOWN = tuple(REGISTRY)
DESCRIPTIONS = {name: record.description for name, record in REGISTRY.items()}
IMITATED = {name: record.imitates for name, record in REGISTRY.items()}


def _duplicates(names: Sequence[str]) -> list[str]:
    counts = collections.Counter(names)
    return sorted(name for name, count in counts.items() if count > 1)


def validate(names: Sequence[str]) -> list[str]:
    """Checks a sequence of perturbation names (empty: none); returns a list.

    Raises:
        ValueError: an unknown or repeated name, listing the known ones.
    """
    names = list(names)
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise ValueError(
            f"Expected `perturb` names from {', '.join(KNOWN)} (or all, none). "
            f"Received: perturb={','.join(names)!r} (unknown: {', '.join(unknown)})"
        )
    repeated = _duplicates(names)
    if repeated:
        raise ValueError(
            "Expected each `perturb` name once. Received: "
            f"perturb={','.join(names)!r} ({', '.join(repeated)} repeated). "
            "Name each perturbation once."
        )
    return names


def parse(text: str | None) -> list[str]:
    """Names from a comma-separated `--perturb` value.

    None or "all": the default set `ALL` (not `threads`, which is opt-in);
    "none": no perturbation (identical processes); otherwise names from
    `KNOWN`, each once, e.g. "affinity,threads".

    Raises:
        ValueError: an empty value or name, an unknown or repeated name, or
            "all"/"none" mixed with other names; the message names the flag
            (`perturb`) and says what to pass.
    """
    if text is None or text.strip() == "all":
        return list(ALL)
    if text.strip() == NONE:
        return []
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or "" in parts:
        raise ValueError(
            "Expected `perturb` to be all, none or comma-separated names from "
            f"{', '.join(KNOWN)}. Received: perturb={text!r} (an empty name). "
            "Pass `perturb=none` for identical processes."
        )
    special = [part for part in parts if part in ("all", NONE)]
    if special:
        raise ValueError(
            f"Expected '{special[0]}' alone in `perturb`. Received: "
            f"perturb={text!r}. Pass either '{special[0]}' or a list of names."
        )
    return validate(parts)


def applied_in_child() -> dict[str, str]:
    """Applies every in-child perturbation this process's environment asks for.

    Called by `tfdet._child._start.child_start` in every kind of run.

    Returns:
        `{perturbation: what was done}` for each one applied.
    """
    done = {}
    for name, record in REGISTRY.items():
        if record.in_child is not None:
            what = record.in_child()
            if what is not None:
                done[name] = what
    return done
