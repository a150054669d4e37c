"""TARGETs for the `tfdet check --workers` tests."""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

from tests.targets.check_models import _dense_model

# The training step at which `dies_on_worker_1` kills worker 1's process.
DIE_AT_STEP = 2


def _task_index() -> int | None:
    """This process's worker index under TF_CONFIG, or None outside a cluster."""
    config = os.environ.get("TF_CONFIG")
    return json.loads(config)["task"]["index"] if config else None


class DieOnWorker1(keras.layers.Layer):
    """Passes its input through; worker 1's process exits at step DIE_AT_STEP.

    The step is counted in Python (tf.py_function runs eagerly at every
    step), and `os._exit` kills the process without unwinding, as a machine
    that loses power or an out-of-memory kill would: worker 0 is left waiting
    in the next collective, which only the check's gang stop can end.
    """

    steps_seen = 0

    def call(self, inputs, training=None):
        if not training:
            return inputs

        def count() -> float:
            DieOnWorker1.steps_seen += 1
            if _task_index() == 1 and DieOnWorker1.steps_seen > DIE_AT_STEP:
                os._exit(17)
            return 0.0

        zero = tf.py_function(count, [], tf.float32)
        zero.set_shape(())  # py_function's shape is unknown to Keras.
        return inputs + zero


def dies_on_worker_1() -> keras.Model:
    return _dense_model(DieOnWorker1())
