"""A fit that BackupAndRestore resumes: Dense + Dropout, Adam with a schedule.

`python resumable_fit.py OUT BACKUP [--save-freq N] [--kill E:B] [--kill-at-save K]
[--data array|tfdata|tfdata-repeat|pydataset|generator] [--model dense|conv]
[--threads N] [--tensorflow-products] [--plain] [--tf-keras] [--backups N] [--unpatched] [--drop-epoch-random]
[--other-data-on-resume] [--batch-size N]`:
trains 4 epochs of 256 samples (8 batches of 32, shuffled) under
`tfdet.enable(seed=3)` and writes the final weights' digest to OUT.
`--model conv` trains Conv2D + BatchNormalization + GELU instead of the first
Dense layer (the kind of model whose bits differed between an AMD and an
Intel CPU before tfdet's patches); `--threads N` gives the profile N threads
per pool (0: every core; unset: enable()'s default, the CPUs the process
may use), and `--tensorflow-products` leaves tfdet's products and
convolutions out (kernels and compositions), whose bits do not follow N;
`--plain` trains without tfdet (seeds and TensorFlow's op determinism only);
`--tf-keras` trains with tf_keras (its own BackupAndRestore). `--kill E:B` kills the process (SIGKILL) after batch B of epoch E;
`--kill-at-save K` kills it while it writes its K-th backup, after the weights
(tf_keras: the checkpoint) and before the backup is made current; `--unpatched` leaves out tfdet's
`keras_backup_and_restore` patch (Keras's own BackupAndRestore);
`--drop-epoch-random` removes from the current backup the global generators'
state at its epoch's start, as a backup written before tfdet kept it;
`--batch-size N` fits arrays in batches of N (default 32);
`--other-data-on-resume` reverses the samples' order when BACKUP exists at
the start (a resume made inexact on purpose: it trains other batches);
`--backups N`
gives fit N BackupAndRestore callbacks (BACKUP, BACKUP-2, ...), with the one
save_freq or one each (`--save-freq 3,epoch`). OUT also gets the optimizer's
step count.
"""

import argparse
import hashlib
import json
import os
import signal

import tfdet
from tfdet._patching import _registry

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("backup")
parser.add_argument("--save-freq", default="epoch")
parser.add_argument("--kill")
parser.add_argument("--kill-at-save", type=int)
parser.add_argument("--data", default="array")
parser.add_argument("--model", choices=("dense", "conv"), default="dense")
parser.add_argument("--threads", type=int)
parser.add_argument("--tensorflow-products", action="store_true")
parser.add_argument("--plain", action="store_true")
parser.add_argument("--tf-keras", action="store_true")
parser.add_argument("--backups", type=int, default=1)
parser.add_argument("--unpatched", action="store_true")
parser.add_argument("--drop-epoch-random", action="store_true")
parser.add_argument("--other-data-on-resume", action="store_true")
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()
resuming = os.path.isdir(args.backup)

if args.drop_epoch_random:
    from tfdet._resume import _keras3 as exact

    try:
        with open(os.path.join(args.backup, exact.CURRENT)) as handle:
            state = os.path.join(
                args.backup, f"tfdet-{handle.read().strip()}.state.json"
            )
    except FileNotFoundError:
        state = None
    if state is not None:
        with open(state) as handle:
            saved = json.load(handle)
        saved.pop("epoch_random", None)
        with open(state, "w") as handle:
            json.dump(saved, handle)

patches = [
    name
    for name in _registry.resolve("auto")
    if not (args.unpatched and name == "keras_backup_and_restore")
]
if args.tf_keras:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
if args.tensorflow_products:
    patches = [name for name in patches if name not in _registry.cpu_only_names()]
if not args.plain:
    threads = None if args.threads is None else args.threads or os.cpu_count()
    tfdet.enable(seed=3, patches=patches, threads=threads)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.tf_keras:
    import tf_keras as keras
else:
    import keras

if args.plain:  # TensorFlow's own answer: seeds and op determinism, no tfdet.
    keras.utils.set_random_seed(3)
    tf.config.experimental.enable_op_determinism()

rng = np.random.RandomState(0)
x = rng.standard_normal((256, 16)).astype(np.float32)
y = keras.utils.to_categorical(rng.randint(0, 4, 256), 4)
if args.other_data_on_resume and resuming:
    x, y = x[::-1].copy(), y[::-1].copy()
if args.model == "conv":
    first = [
        keras.layers.Reshape((4, 4, 1)),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.Activation("gelu"),
        keras.layers.Flatten(),
    ]
else:
    first = [keras.layers.Dense(32, activation="relu")]
model = keras.Sequential(
    [
        keras.Input((16,)),
        *first,
        keras.layers.Dropout(0.3),
        keras.layers.Dense(4, activation="softmax"),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(1e-2, 5, 0.9)
    ),
    loss="categorical_crossentropy",
    metrics=["accuracy"],
)

saves = 0
if args.kill_at_save and args.tf_keras:
    # tf_keras's backup is a tf.train.Checkpoint: written, then made current.
    record_state = tf.train.CheckpointManager._record_state

    def killed_while_saving(self, *a, **k):
        global saves
        saves += 1
        if saves == args.kill_at_save:
            os.kill(os.getpid(), signal.SIGKILL)
        record_state(self, *a, **k)

    tf.train.CheckpointManager._record_state = killed_while_saving
elif args.kill_at_save:
    save_weights = keras.Model.save_weights

    def killed_while_saving(self, *a, **k):
        global saves
        save_weights(self, *a, **k)
        saves += 1
        if saves == args.kill_at_save:
            os.kill(os.getpid(), signal.SIGKILL)

    keras.Model.save_weights = killed_while_saving


class Kill(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if args.kill and [int(v) for v in args.kill.split(":")] == [self.epoch, batch]:
            os.kill(os.getpid(), signal.SIGKILL)


# One save_freq for all, or one per callback ("3,epoch").
freqs = [f if f == "epoch" else int(f) for f in args.save_freq.split(",")]
freqs += freqs[-1:] * (args.backups - len(freqs))
directories = [args.backup] + [f"{args.backup}-{n}" for n in range(2, args.backups + 1)]
callbacks = [
    *(
        keras.callbacks.BackupAndRestore(d, save_freq=f)
        for d, f in zip(directories, freqs, strict=True)
    ),
    Kill(),
]
if args.data == "pydataset":

    class Batches(keras.utils.PyDataset):
        """8 batches of 32, reshuffled by the dataset itself each epoch."""

        def __init__(self):
            super().__init__(workers=2, use_multiprocessing=False)
            self.order = np.arange(256)
            self.rng = np.random.RandomState(5)

        def __len__(self):
            return 8

        def __getitem__(self, index):
            rows = self.order[32 * index : 32 * (index + 1)]
            return x[rows], y[rows]

        def on_epoch_end(self):
            self.rng.shuffle(self.order)

    model.fit(Batches(), epochs=4, verbose=0, callbacks=callbacks)
elif args.data == "generator":

    def batches():
        """Endless shuffled batches of 32, from a generator of its own seed."""
        order_rng = np.random.RandomState(7)
        while True:
            order = order_rng.permutation(256)
            for start in range(0, 256, 32):
                rows = order[start : start + 32]
                yield x[rows], y[rows]

    model.fit(batches(), steps_per_epoch=8, epochs=4, verbose=0, callbacks=callbacks)
elif args.data == "tfdata-repeat":
    # One stream for all epochs (steps_per_epoch), reshuffled on each pass.
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=11)
    data = data.batch(32).repeat()
    model.fit(data, steps_per_epoch=8, epochs=4, verbose=0, callbacks=callbacks)
elif args.data == "tfdata":
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=11).batch(32)
    model.fit(data, epochs=4, verbose=0, callbacks=callbacks)
else:
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=4,
        shuffle=True,
        verbose=0,
        callbacks=callbacks,
    )
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights()))
with open(args.out, "w") as handle:
    steps = int(model.optimizer.iterations)
    json.dump({"digest": digest.hexdigest()[:16], "steps": steps}, handle)
