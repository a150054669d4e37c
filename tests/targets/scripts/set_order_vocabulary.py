"""A vocabulary built from `list(set(...))`: its order follows the hash seed.

Token ids, and so the embedding rows each word trains, depend on
PYTHONHASHSEED: the runs of a check, which each get another hash seed,
diverge, and only the hash seed separates them.
"""

import keras
import numpy as np

words = [
    "the",
    "cat",
    "sat",
    "on",
    "the",
    "mat",
    "while",
    "a",
    "dog",
    "ran",
    "past",
    "the",
    "door",
]
vocabulary = list(set(words))
ids = np.array([[vocabulary.index(w) for w in words[i : i + 4]] for i in range(8)])
y = np.arange(8, dtype=np.float32).reshape(-1, 1) / 8
model = keras.Sequential(
    [
        keras.Input((4,)),
        keras.layers.Embedding(len(vocabulary), 3),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ]
)
model.compile(optimizer="sgd", loss="mse")
model.fit(ids, y, batch_size=4, epochs=1, verbose=0)
