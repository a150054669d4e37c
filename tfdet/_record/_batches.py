"""What each training step trained on: a fingerprint of its batch.

A resumed training can give the bits of the one that never stopped only if
each step trains the same batch. Keras's callbacks never see the batch, so
`watch` wraps the model's `train_step`: inside the traced step (XLA
included) it checksums the batch it was given (`_bits.batch_checksum`) into
a variable that the callback reads after the step. A trace records it as
the step's `data`, and a comparison reports a different batch before the
loss and weights that follow from it: at the first resumed step it says
that the data position or order was lost, not merely that the weights
differ.
"""

from __future__ import annotations

from typing import Any

from tfdet._pin import _distribution
from tfdet._record import _bits

# The model attribute that holds the watch of its wrapped `train_step`.
_WATCH = "_tfdet_batch_watch"
# Before the first step: no uint32 checksum is negative.
_UNSET = -1


class BatchWatch:
    """Reads the fingerprint of the batch of a model's last training step."""

    def __init__(self, variable: Any) -> None:
        self._variable = variable

    def fingerprint(self) -> str | None:
        """16 hex digits of the last step's batch; None before any step."""
        first, second = (int(v) for v in self._variable.numpy())
        if first == _UNSET:
            return None
        return _bits.checksum_hex([[first, second]])[0]


def fingerprint(data: Any) -> str | None:
    """The fingerprint `BatchWatch` gives for a batch, computed here and now.

    None in tf.compat.v1 graph mode, which has no eager op to compute it.
    """
    import numpy as np
    import tensorflow as tf

    if not tf.executing_eagerly():
        return None
    return _bits.checksum_hex([np.asarray(_bits.batch_checksum(data))])[0]


def watch(model: Any) -> BatchWatch | None:
    """Makes `model`'s training steps leave their batch's fingerprint.

    Idempotent: a model already watched keeps its watch (and its traced
    train function). A train function traced before is dropped, so that
    the next step traces the watched one.

    Returns:
        The watch, or None where a step cannot be watched: tf.compat.v1
        graph mode (no eager variable to read), a model trained under a
        `tf.distribute` strategy (each replica sees its own part of the
        batch), or a model without a `train_step`.
    """
    import tensorflow as tf

    existing = model.__dict__.get(_WATCH)
    if existing is not None:
        return existing
    if not tf.executing_eagerly() or not callable(getattr(model, "train_step", None)):
        return None
    if _distribution.describe(getattr(model, "distribute_strategy", None)):
        return None  # Under a strategy: each replica sees part of the batch.
    # Not tracked by the model (it is no weight of it, and no checkpoint
    # holds it): created outside any Keras scope, held by the closure only.
    with tf.init_scope():
        variable = tf.Variable(
            [_UNSET, _UNSET], dtype=tf.int64, trainable=False, name="tfdet_batch"
        )
    train_step = model.train_step

    def watched_train_step(data: Any) -> Any:
        variable.assign(tf.cast(_bits.batch_checksum(data), tf.int64))
        return train_step(data)

    result = BatchWatch(variable)
    # object.__setattr__: Keras's attribute tracking must not see either.
    object.__setattr__(model, "train_step", watched_train_step)
    object.__setattr__(model, _WATCH, result)
    if getattr(model, "train_function", None) is not None:
        object.__setattr__(model, "train_function", None)
    return result
