"""Keras 3 training under `MultiWorkerMirroredStrategy` (TF backend).

Keras 3.15's TensorFlow trainer cannot train under a multi-worker strategy
(keras-team/keras#20585, open since Keras 3.0): `fit` fails before the first
step with "Attempt to convert a value (PerReplica...) ... to a Tensor", and
once past that, the step fails on "Invalid reduction dimension 0 for input
with 0 dimensions". Two functions of `keras.src.backend.tensorflow.trainer`
are at fault:

- `_maybe_symbolic_build` averages the first distributed batch with an eager
  `strategy.reduce("MEAN", ...)` only to learn its shapes; a multi-worker
  strategy cannot reduce eagerly outside a step. The shapes of the local
  replica's batch are the same, so they are used instead.
- `reduce_per_replica` reduces every logged value with
  `strategy.reduce("MEAN", v, axis=0)` under a multi-worker strategy, which
  fails for a scalar (a loss, a metric). A scalar is averaged over replicas
  with `axis=None`, as single-worker strategies already do.

Both replacements change only the multi-worker path: every other strategy
(and no strategy) runs Keras's own code. The averaged values are the same
collective all-reduce Keras meant to run, so the bits are TensorFlow's.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import KERAS3, Patch
from tfdet._patching._swap import Swap


def _apply(swap: Swap) -> None:
    import keras

    if keras.config.backend() != "tensorflow":
        return
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    multi_worker = trainer._collective_all_reduce_multi_worker  # noqa: SLF001
    original_build = trainer.TensorFlowTrainer._maybe_symbolic_build  # noqa: SLF001
    original_reduce = trainer.reduce_per_replica

    def local_batch(strategy: Any, batch: Any) -> Any:
        def first_replica(value: Any) -> Any:
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        return tree.map_structure(first_replica, batch)

    def maybe_symbolic_build(
        self: Any, iterator: Any = None, data_batch: Any = None
    ) -> Any:
        strategy = self._distribute_strategy  # noqa: SLF001
        if strategy is None or iterator is None or not multi_worker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:
            data_batch = local_batch(strategy, next(batches))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)  # noqa: SLF001
        return None

    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction not in ("auto", "mean") or not multi_worker(strategy):
            return original_reduce(values, strategy, reduction)

        def mean(value: Any) -> Any:
            rank = strategy.experimental_local_results(value)[0].shape.rank
            return strategy.reduce("MEAN", value, axis=None if rank == 0 else 0)

        return tree.map_structure(mean, values)

    swap.attribute(
        trainer.TensorFlowTrainer, "_maybe_symbolic_build", maybe_symbolic_build
    )
    swap.attribute(trainer, "reduce_per_replica", reduce_per_replica)


PATCH = Patch(
    summary="Keras 3 fit/train_on_batch under MultiWorkerMirroredStrategy "
    "(eager PerReplica reduce, axis=0 mean of scalars) -> local shapes, axis=None",
    upstream="https://github.com/keras-team/keras/issues/20585",
    apply=_apply,
    requires=KERAS3,
)
