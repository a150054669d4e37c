"""MultiWorkerMirroredStrategy's collectives: AUTO becomes RING.

`tf.distribute.experimental.CommunicationImplementation.AUTO`, the default,
lets TensorFlow choose the all-reduce when the strategy starts: RING on CPUs,
NCCL where there are GPUs, so one script reduces its gradients with another
algorithm (and another summation order) on another cluster
(tensorflow/tensorflow#121429: RING and AUTO give different results). RING
runs on every device, so AUTO is replaced by RING and the algorithm no
longer depends on what the cluster has. An implementation the user chose
(RING or NCCL) is kept, as are `bytes_per_pack` and `timeout_seconds`.

The strategy's extended object, which every way of building a
`MultiWorkerMirroredStrategy` (V1 or V2) goes through, takes the options;
`tfdet._pin._distribution` reads them back into each trace's header,
with who chose the implementation (`collective_chosen_by`).
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap
from tfdet._pin._distribution import CHOSEN_BY


def _apply(swap: Swap) -> None:
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy

    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
    original = extended.__init__
    implementations = tf.distribute.experimental.CommunicationImplementation

    def __init__(  # noqa: N807 - replaces TensorFlow's constructor
        self: Any,
        container_strategy: Any,
        cluster_resolver: Any,
        communication_options: Any,
        devices: Any = None,
    ) -> None:
        chosen_by = "user"
        if (
            getattr(communication_options, "implementation", None)
            == implementations.AUTO
        ):
            communication_options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=communication_options.bytes_per_pack,
                timeout_seconds=communication_options.timeout_seconds,
                implementation=implementations.RING,
            )
            chosen_by = "tfdet"
        original(
            self, container_strategy, cluster_resolver, communication_options, devices
        )
        setattr(self, CHOSEN_BY, chosen_by)

    swap.attribute(extended, "__init__", __init__)


PATCH = Patch(
    summary="MultiWorkerMirroredStrategy collective implementation AUTO "
    "(RING on CPU, NCCL on GPU) -> RING; an explicit choice is kept",
    upstream="https://github.com/tensorflow/tensorflow/issues/121429",
    apply=_apply,
    distribution={"collective": "RING"},
)
