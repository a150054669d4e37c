"""The manual resume of Keras's docs: ModelCheckpoint, load_model, initial_epoch.

`python model_checkpoint_resume.py OUT CHECKPOINT full|kill|resume [tf_keras]`: under
`tfdet.enable(seed=3)`, a Dense + Dropout model trains 4 epochs of 256
shuffled samples, saving CHECKPOINT (`.keras`) after each epoch; `kill` kills
the process (SIGKILL) after epoch 2, `resume` loads CHECKPOINT and continues
with `fit(initial_epoch=2)`; `tf_keras` builds it with tf_keras. OUT gets the
final weights' digest.
"""

import hashlib
import json
import os
import signal
import sys

import tfdet

out, checkpoint, mode = sys.argv[1:4]
if sys.argv[4:] == ["tf_keras"]:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
tfdet.enable(seed=3)

import numpy as np  # noqa: E402

if sys.argv[4:] == ["tf_keras"]:
    import tf_keras as keras
else:
    import keras

rng = np.random.RandomState(0)
x = rng.standard_normal((256, 16)).astype(np.float32)
y = keras.utils.to_categorical(rng.randint(0, 4, 256), 4)
if mode == "resume":
    model = keras.models.load_model(checkpoint)
    initial_epoch = 2
else:
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    initial_epoch = 0


class Kill(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if mode == "kill" and epoch == 1:
            os.kill(os.getpid(), signal.SIGKILL)


model.fit(
    x,
    y,
    batch_size=32,
    epochs=4,
    initial_epoch=initial_epoch,
    shuffle=True,
    verbose=0,
    callbacks=[keras.callbacks.ModelCheckpoint(checkpoint), Kill()],
)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights()))
with open(out, "w") as handle:
    json.dump({"digest": digest.hexdigest()[:16]}, handle)
