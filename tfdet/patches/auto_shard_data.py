"""Dataset auto-sharding under `tf.distribute`: AUTO becomes DATA.

A multi-worker strategy shards each dataset it distributes by the dataset's
`experimental_distribute.auto_shard_policy`. The default, AUTO, decides
from the pipeline's graph: FILE (each worker reads every N-th file) when it
finds a file reader, else DATA (each worker reads everything and keeps every
N-th element). So which samples a worker trains on, and with them the bits,
follow how the data happen to be stored: the same samples read from memory,
from one file or from eight files give three trainings. DATA gives the same
samples to the same worker whatever the storage, and works on every
pipeline; it is what AUTO already picks for in-memory data. Its cost is
reading: every worker reads the whole dataset. A policy set on the dataset
(FILE, DATA, OFF, HINT) is kept: FILE is the fast choice for large file
datasets when the file layout is part of the experiment.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def _apply(swap: Swap) -> None:
    import tensorflow as tf
    from tensorflow.python.distribute import input_ops

    original = input_ops.auto_shard_dataset
    policies = tf.data.experimental.AutoShardPolicy

    def auto_shard_dataset(
        dataset: Any, num_shards: Any, index: Any, num_replicas_in_sync: Any = None
    ) -> Any:
        if (
            isinstance(dataset, tf.data.Dataset)
            and dataset.options().experimental_distribute.auto_shard_policy
            == policies.AUTO
        ):
            data = tf.data.Options()
            data.experimental_distribute.auto_shard_policy = policies.DATA
            dataset = dataset.with_options(data)
        return original(dataset, num_shards, index, num_replicas_in_sync)

    # `input_lib` calls it through the module, so this reaches every
    # distributed dataset (Keras `fit`, `experimental_distribute_dataset`).
    swap.attribute(input_ops, "auto_shard_dataset", auto_shard_dataset)


PATCH = Patch(
    summary="tf.distribute dataset auto-shard policy AUTO (FILE or DATA, by "
    "how the data are stored) -> DATA; a policy set on the dataset is kept",
    upstream="https://www.tensorflow.org/api_docs/python/tf/data/experimental/AutoShardPolicy",
    apply=_apply,
    distribution={"auto_shard_policy": "DATA"},
)
