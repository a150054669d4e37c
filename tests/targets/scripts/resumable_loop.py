"""A custom GradientTape loop resumed from a tf.train.Checkpoint.

`python resumable_loop.py OUT CKPT_DIR [--kill STEP] [--without-random-state]
[--tf-keras]`:
16 steps over a shuffled `tf.data` pipeline with a random augmentation drawn
from the pipeline's own seeds (`Dataset.random` feeding a stateless op), a
Dropout layer, Adam; checkpoints the model, optimizer, data iterator, step and
(unless told not to) `tfdet.random_state(model)` every 3 steps; `--kill STEP`
kills the process (SIGKILL) after that step; `--tf-keras` builds the model and
optimizer with tf_keras. Writes the final weights' digest.
"""

import argparse
import hashlib
import json
import os
import signal

import tfdet

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("checkpoints")
parser.add_argument("--kill", type=int)
parser.add_argument("--without-random-state", action="store_true")
parser.add_argument("--tf-keras", action="store_true")
args = parser.parse_args()
if args.tf_keras:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
tfdet.enable(seed=5)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.tf_keras:
    import tf_keras as keras
else:
    import keras

rng = np.random.RandomState(0)
x = rng.standard_normal((128, 8)).astype(np.float32)
y = rng.standard_normal((128, 1)).astype(np.float32)


def augment(seed, example):
    features, label = example
    noise = tf.random.stateless_normal(tf.shape(features), seed=seed, stddev=0.01)
    return features + noise, label


data = (
    tf.data.Dataset.zip(
        (
            tf.data.Dataset.random(seed=7).batch(2),
            tf.data.Dataset.from_tensor_slices((x, y)),
        )
    )
    .map(augment)
    .shuffle(128, seed=3)
    .batch(16)
    .repeat()
)
model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(1),
    ]
)
optimizer = keras.optimizers.Adam(1e-2)
optimizer.build(model.trainable_variables)
iterator = iter(data)
step = tf.Variable(0, dtype=tf.int64)
items = {"model": model, "optimizer": optimizer, "iterator": iterator, "step": step}
if not args.without_random_state:
    items["random"] = tfdet.random_state(model)
manager = tf.train.CheckpointManager(
    tf.train.Checkpoint(**items), args.checkpoints, max_to_keep=2
)
manager.restore_or_initialize()


@tf.function
def train_step(features, labels):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(features, training=True) - labels) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))


while int(step.numpy()) < 16:
    train_step(*next(iterator))
    step.assign_add(1)
    if int(step.numpy()) % 3 == 0:
        manager.save()
    if args.kill == int(step.numpy()):
        os.kill(os.getpid(), signal.SIGKILL)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights()))
with open(args.out, "w") as handle:
    json.dump({"digest": digest.hexdigest()[:16]}, handle)
