"""A `keras.utils.PyDataset` feeding `fit`, with the callbacks people add.

A regression MLP (Dense, BatchNormalization, Dropout; Huber loss, AdamW
with weight decay, a `CosineDecay` schedule) fed by a PyDataset that
shuffles its own index each epoch from a seeded generator; as a script,
with `ReduceLROnPlateau`, `EarlyStopping`, `TerminateOnNaN` and a
`CSVLogger` that appends to an existing log in the working directory.
"""

import keras
import numpy as np


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size
        self.order = np.arange(len(x))
        self.rng = np.random.default_rng(8)

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size : (index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.rng.shuffle(self.order)


def build():
    model = keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(256, activation="gelu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(256, activation="gelu"),
            keras.layers.Dense(1),
        ]
    )
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=100)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=1e-4),
        loss=keras.losses.Huber(),
        metrics=["mae"],
    )
    rng = np.random.default_rng(9)
    x = rng.standard_normal((256, 20)).astype("float32")
    y = (x @ rng.standard_normal((20, 1))).astype("float32")
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    model.fit(
        Batches(x[:192], y[:192], 32),
        validation_data=Batches(x[192:], y[192:], 32),
        epochs=3,
        callbacks=[
            keras.callbacks.ReduceLROnPlateau(patience=1),
            keras.callbacks.EarlyStopping(patience=2),
            keras.callbacks.TerminateOnNaN(),
            keras.callbacks.CSVLogger("history.csv", append=True),
        ],
        verbose=0,
    )
