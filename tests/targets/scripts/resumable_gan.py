"""A GAN that BackupAndRestore resumes: keras.io's DCGAN form, two optimizers.

`python resumable_gan.py OUT BACKUP [--save-freq N] [--kill E:B] [--unpatched]
[--tf-keras]`:
trains 3 epochs of 128 samples (8 batches of 16) of a Dense generator and
discriminator under `tfdet.enable(seed=5)`, with a custom `compile` that
sets `d_optimizer` and `g_optimizer` and a `train_step` that draws its
latent vectors and label noise from the model's own `SeedGenerator` (as
keras.io's "DCGAN overriding train_step" does). Writes the final weights'
digest and both optimizers' step counts to OUT. `--kill E:B` kills the
process (SIGKILL) after batch B of epoch E; `--unpatched` leaves out tfdet's
`keras_backup_and_restore` patch; `--tf-keras` builds it with tf_keras, its
noise drawn from a `tf.random.Generator` the model tracks (tf_keras has no
`SeedGenerator`).
"""

import argparse
import hashlib
import json
import os
import signal
import types

import tfdet
from tfdet._patching import _registry

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("backup")
parser.add_argument("--save-freq", default="1")
parser.add_argument("--kill")
parser.add_argument("--unpatched", action="store_true")
parser.add_argument("--tf-keras", action="store_true")
args = parser.parse_args()
if args.tf_keras:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

patches = [
    name
    for name in _registry.resolve("auto")
    if not (args.unpatched and name == "keras_backup_and_restore")
]
tfdet.enable(seed=5, patches=patches)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.tf_keras:
    import tf_keras as keras

    # What the step uses of `keras.ops`.
    ops = types.SimpleNamespace(
        shape=tf.shape, concatenate=tf.concat, ones=tf.ones, zeros=tf.zeros
    )
else:
    import keras
    from keras import ops

LATENT = 8


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        if args.tf_keras:
            self.seed_generator = tf.random.Generator.from_seed(1337)
        else:
            self.seed_generator = keras.random.SeedGenerator(1337)

    def normal(self, shape):
        if args.tf_keras:
            return self.seed_generator.normal(shape)
        return keras.random.normal(shape, seed=self.seed_generator)

    def uniform(self, shape):
        if args.tf_keras:
            return self.seed_generator.uniform(shape)
        return keras.random.uniform(shape, seed=self.seed_generator)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    def call(self, samples):  # BackupAndRestore wants a built model.
        return self.discriminator(samples)

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real):
        batch = ops.shape(real)[0]
        latent = self.normal((batch, LATENT))
        combined = ops.concatenate([self.generator(latent), real], axis=0)
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], 0)
        labels += 0.05 * self.uniform(ops.shape(labels))
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(
            zip(tape.gradient(d_loss, weights), weights, strict=True)
        )
        latent = self.normal((batch, LATENT))
        with tf.GradientTape() as tape:
            fake = self.discriminator(self.generator(latent))
            g_loss = self.loss_fn(ops.zeros((batch, 1)), fake)
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(
            zip(tape.gradient(g_loss, weights), weights, strict=True)
        )
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


discriminator = keras.Sequential(
    [keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
     keras.layers.Dropout(0.2), keras.layers.Dense(1)]
)  # fmt: skip
generator = keras.Sequential(
    [keras.Input((LATENT,)), keras.layers.Dense(16, activation="relu"),
     keras.layers.Dense(12)]
)  # fmt: skip
gan = GAN(discriminator, generator)
gan.compile(
    d_optimizer=keras.optimizers.Adam(1e-3),
    g_optimizer=keras.optimizers.Adam(2e-3),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
gan.build((None, 12))


class Kill(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if args.kill and [int(v) for v in args.kill.split(":")] == [self.epoch, batch]:
            os.kill(os.getpid(), signal.SIGKILL)


real = np.random.RandomState(0).standard_normal((128, 12)).astype(np.float32)
save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
callbacks = [keras.callbacks.BackupAndRestore(args.backup, save_freq=save_freq), Kill()]
gan.fit(real, batch_size=16, epochs=3, shuffle=True, verbose=0, callbacks=callbacks)
digest = hashlib.sha256(b"".join(w.tobytes() for w in gan.get_weights()))
with open(args.out, "w") as handle:
    json.dump(
        {
            "digest": digest.hexdigest()[:16],
            "steps": [int(gan.d_optimizer.iterations), int(gan.g_optimizer.iterations)],
        },
        handle,
    )
