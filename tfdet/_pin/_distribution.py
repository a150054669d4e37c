"""What a `tf.distribute` strategy makes of a run: replicas, workers, task.

Traces record these facts in their header (`distribution`), so that two
traces of a distributed training say how many replicas and workers made
them, and which worker wrote each; `tfdet diff` shows them side by side.
"""

from __future__ import annotations

from typing import Any

# TensorFlow's classes whose `tf.distribute` name is another: the trace says
# what the user wrote.
_PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
# Attribute of a multi-worker strategy's extended object that says who chose
# its collective implementation: "tfdet" (the collective_ring patch pinned
# AUTO to RING) or "user" (absent: the user, or TensorFlow's AUTO).
CHOSEN_BY = "_tfdet_collective_chosen_by"


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
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if cluster:
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
