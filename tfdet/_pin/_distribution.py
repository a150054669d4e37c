"""What decides the bits under `tf.distribute`, and what a strategy made of a run.

Two records: the profile's `distribution` section (`pinned`: the settings
tfdet's installed patches decide, or TensorFlow's and Keras's defaults where
none does), and each trace header's `distribution` facts (`describe`: how
many replicas and workers made the run, which worker wrote the trace, and
the all-reduce it ran). `tfdet diff` compares both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# TensorFlow's classes whose `tf.distribute` name is another: the trace says
# what the user wrote.
_PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
# Attribute of a multi-worker strategy's extended object that says who chose
# its collective implementation: "tfdet" (the collective_ring patch pinned
# AUTO to RING) or "user" (absent: the user, or TensorFlow's AUTO).
CHOSEN_BY = "_tfdet_collective_chosen_by"


def pinned(patches: Iterable[Any], keras_flavor: str) -> tuple[tuple[str, str], ...]:
    """The profile's `distribution` section under the installed `patches`.

    Args:
        patches: The installed `tfdet._patching._registry.Patch` objects; each
            one's `distribution` entries replace the defaults below.
        keras_flavor: "keras3" or "tf_keras" (their replicas draw random
            values differently).

    Returns:
        `(setting, value)` pairs sorted by setting.
    """
    settings = {
        # MultiWorkerMirroredStrategy: TensorFlow picks RING or NCCL by device.
        "collective": "AUTO",
        # A dataset's own policy; AUTO means FILE or DATA by its storage.
        "auto_shard_policy": "AUTO",
        # Keras 3's replicas read one SeedGenerator state (keras#18426);
        # tf_keras's draw from per-replica streams (measured).
        "replica_seeds": "per replica" if keras_flavor == "tf_keras" else "shared",
        "refused": "nothing",
    }
    for patch in patches:
        settings.update(patch.distribution)
    return tuple(sorted(settings.items()))


def describe(strategy: Any) -> dict[str, Any] | None:
    """The cluster facts of `strategy`, or None for no strategy (one device).

    Returns:
        `{"strategy": its `tf.distribute` name, "replicas": replicas in sync, "workers":
        worker processes, "worker": this process's task index (None for a
        one-process strategy)}`, and for a multi-worker strategy its
        collective implementation, who chose it and its `bytes_per_pack`.
    """
    if strategy is None:
        return None
    name = type(strategy).__name__
    if name.startswith("_Default"):  # No `strategy.scope()`: one replica.
        return None
    workers, worker = 1, None
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and (cluster := resolver.cluster_spec().as_dict()):
        workers = sum(len(cluster.get(job, ())) for job in ("chief", "worker"))
        worker = resolver.task_id
    return {
        "strategy": _PUBLIC_NAMES.get(name, name),
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": workers,
        "worker": worker,
        **_collectives(strategy.extended),
    }


def _collectives(extended: Any) -> dict[str, Any]:
    """The all-reduce a multi-worker strategy runs: implementation, packing,
    and who chose the implementation ("tfdet" where enable() pinned AUTO to
    RING, "user" otherwise); empty for strategies without these options."""
    options = getattr(extended, "_communication_options", None)
    if options is None:
        return {}
    return {
        "collective": options.implementation.name,
        "collective_chosen_by": getattr(extended, CHOSEN_BY, "user"),
        "bytes_per_pack": options.bytes_per_pack,
    }
