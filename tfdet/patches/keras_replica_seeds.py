"""Keras 3 random ops under `tf.distribute`: one seed stream per replica.

Keras 3 draws the seed of every random op (Dropout's mask, GaussianNoise,
random augmentation) from a `SeedGenerator` whose state is one variable,
mirrored on every replica. Inside `strategy.run` each replica reads the same
state, so every replica draws the same mask for its own slice of the batch
(keras-team/keras#18426): a 2-replica training is not the training of one
device on the global batch, and adding replicas repeats the noise instead of
drawing more.

The seed each replica draws is folded with its replica id in the sync group
(`tf.random.experimental.stateless_fold_in`, a Philox hash, so replica
streams do not overlap the way `seed + id` would), which makes the replicas
draw different values that are the same in every run. Only a replica
context of more than one replica is changed: a one-device training, and
code in the cross-replica context (weight initializers under
`strategy.scope()`, which must agree on every replica), draw Keras's seeds
unchanged. Across workers the ids are global, so no two replicas of a
`MultiWorkerMirroredStrategy` share a stream either.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import KERAS3, Patch
from tfdet._patching._swap import Swap

# The TensorFlow backend modules that bind `draw_seed` at import; each calls
# it by its module-global name, so swapping that name reaches every random op.
# Older Keras 3 draws no seed in the image module (3.5 has no `draw_seed`
# there): a module without one has nothing to fold.
_MODULES_DRAWING_SEEDS = (
    "keras.src.backend.tensorflow.random",
    "keras.src.backend.tensorflow.image",
)


def _apply(swap: Swap) -> None:
    import importlib

    import keras

    if keras.config.backend() != "tensorflow":
        return
    import tensorflow as tf

    for module_name in _MODULES_DRAWING_SEEDS:
        module = importlib.import_module(module_name)
        original = getattr(module, "draw_seed", None)
        if original is None:
            continue

        def draw_seed(seed: Any, original: Any = original) -> Any:
            drawn = original(seed)
            context = tf.distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync == 1:
                return drawn
            replica = tf.cast(context.replica_id_in_sync_group, drawn.dtype)
            return tf.random.experimental.stateless_fold_in(drawn, replica)

        swap.attribute(module, "draw_seed", draw_seed)


PATCH = Patch(
    summary="Keras 3 random ops under tf.distribute (every replica draws the "
    "same seed) -> seed folded with the replica id",
    upstream="https://github.com/keras-team/keras/issues/18426",
    apply=_apply,
    requires=KERAS3,
    distribution={"replica_seeds": "per replica"},
)
