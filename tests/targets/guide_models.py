"""The models of keras.io's guide "Customizing what happens in `fit()`".

Both override `train_step` and begin it with `x, y = data`, as the guide
writes it (TensorFlow backend): the first with `compute_loss` and the
compiled metrics, the second ("going lower-level") with its own loss
function and metrics and no loss given to `compile`. The guide's model is
one Dense layer on 32 features; these put two wider hidden layers in front,
so that a product's bits follow the thread pool without tfdet (the control
must be able to differ). `batch_unpacking_model`'s step cannot take a batch
as `fit` gives it: the error must name its `train_step`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

_FEATURES = 64
_SAMPLES = 256


class ComputeLossModel(keras.Model):
    """The guide's first example: `compute_loss` and `self.metrics`."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class LowerLevelModel(keras.Model):
    """The guide's "going lower-level" example: its own loss and metrics."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class BatchUnpackingModel(keras.Model):
    """A step that wants three parts where `fit` gives two."""

    def train_step(self, data):
        x, y, sample_weight = data
        return super().train_step((x, y, sample_weight))


def _graph(klass):
    inputs = keras.Input(shape=(_FEATURES,))
    hidden = keras.layers.Dense(512, activation="relu")(inputs)
    hidden = keras.layers.Dense(512, activation="relu")(hidden)
    outputs = keras.layers.Dense(1)(hidden)
    return klass(inputs, outputs)


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((_SAMPLES, _FEATURES)).astype("float32")
    y = rng.standard_normal((_SAMPLES, 1)).astype("float32")
    return x, y


def compute_loss_model():
    model = _graph(ComputeLossModel)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return (model, *_data())


def lower_level_model():
    model = _graph(LowerLevelModel)
    model.compile(optimizer="adam")
    return (model, *_data())


def batch_unpacking_model():
    model = _graph(BatchUnpackingModel)
    model.compile(optimizer="adam", loss="mse")
    return (model, *_data())
