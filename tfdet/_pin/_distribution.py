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


def describe(strategy: Any) -> dict[str, Any] | None:
    """The cluster facts of `strategy`, or None for no strategy (one device).

    Returns:
        `{"strategy": its `tf.distribute` name, "replicas": replicas in sync, "workers":
        worker processes, "worker": this process's task index (None for a
        one-process strategy)}`.
    """
    # TensorFlow's default strategy (no `strategy.scope()`): one replica.
    name = type(strategy).__name__
    if strategy is None or name.startswith("_Default"):
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
    }
