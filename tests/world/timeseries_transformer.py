"""keras.io "Timeseries classification with a Transformer model", small.

Transformer encoder blocks (MultiHeadAttention, LayerNormalization,
Dropout, Conv1D feed-forward), GlobalAveragePooling1D, an MLP head;
sparse categorical cross-entropy, Adam; as a script, `EarlyStopping` with
`restore_best_weights` and a validation split.
"""

import keras
import numpy as np
from keras import layers


def transformer_encoder(inputs, head_size, num_heads, ff_dim, dropout=0):
    x = layers.MultiHeadAttention(
        key_dim=head_size, num_heads=num_heads, dropout=dropout
    )(inputs, inputs)
    x = layers.Dropout(dropout)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    res = x + inputs
    x = layers.Conv1D(filters=ff_dim, kernel_size=1, activation="relu")(res)
    x = layers.Dropout(dropout)(x)
    x = layers.Conv1D(filters=inputs.shape[-1], kernel_size=1)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return x + res


def build():
    inputs = keras.Input(shape=(100, 1))
    x = inputs
    for _ in range(2):
        x = transformer_encoder(x, head_size=64, num_heads=2, ff_dim=4, dropout=0.25)
    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dropout(0.4)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(learning_rate=1e-4),
        metrics=["sparse_categorical_accuracy"],
    )
    rng = np.random.default_rng(4)
    x = rng.standard_normal((96, 100, 1)).astype("float32")
    y = rng.integers(0, 2, (96,))
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    model.fit(
        x,
        y,
        validation_split=0.25,
        epochs=2,
        batch_size=16,
        callbacks=[
            keras.callbacks.EarlyStopping(patience=1, restore_best_weights=True)
        ],
        verbose=0,
    )
