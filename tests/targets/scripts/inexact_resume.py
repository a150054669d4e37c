"""Two fits tfdet cannot resume exactly, which must say so.

`python inexact_resume.py KERAS CASE BACKUP [--kill]`: KERAS is `keras3` or
`tf_keras`; CASE `kernel-random` (a `train_step` that draws noise with
`tf.random.normal`, whose state lives in its kernel) or `sequence` (a
tf_keras `Sequence` input shuffled by `fit`). Trains 2 epochs of 4 batches
under `tfdet.enable(seed=2)` with `BackupAndRestore(BACKUP, save_freq=1)`;
`--kill` kills the process (SIGKILL) after epoch 0's third batch.
"""

import os
import signal
import sys

import tfdet

keras_name, case, backup = sys.argv[1:4]
kill = "--kill" in sys.argv
if keras_name == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
tfdet.enable(seed=2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if keras_name == "tf_keras":
    import tf_keras as keras
else:
    import keras


class NoisyInputs(keras.Model):
    """keras.io's tf.keras GAN form: noise from `tf.random.normal`."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            noisy = x + tf.random.normal(tf.shape(x))
            loss = tf.reduce_mean((self(noisy) - y) ** 2)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(
            zip(grads, self.trainable_variables, strict=True)
        )
        return {"loss": loss}


class Kill(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if kill and batch == 2:
            os.kill(os.getpid(), signal.SIGKILL)


x = np.random.RandomState(0).standard_normal((32, 4)).astype(np.float32)
y = x[:, :1] * 2.0
inputs = keras.Input((4,))
model_class = NoisyInputs if case == "kernel-random" else keras.Model
model = model_class(inputs, keras.layers.Dense(1)(inputs))
model.compile(optimizer="adam", loss="mse")
callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq=1), Kill()]
if case == "sequence":

    class Batches(keras.utils.Sequence):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return x[8 * index : 8 * (index + 1)], y[8 * index : 8 * (index + 1)]

    model.fit(Batches(), shuffle=True, epochs=2, verbose=0, callbacks=callbacks)
else:
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
