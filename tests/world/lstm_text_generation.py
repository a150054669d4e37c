"""keras.io "Character-level text generation with LSTM", on a synthetic text.

One LSTM over one-hot characters, a softmax over the vocabulary; categorical
cross-entropy, RMSprop; as a script, `fit` an epoch at a time with a
sampling step after each, as the example does.
"""

import keras
import numpy as np
from keras import layers

MAXLEN = 40
CHARS = sorted(set("the quick brown fox jumps over the lazy dog,. "))


def _text():
    rng = np.random.default_rng(6)
    return "".join(rng.choice(CHARS, 2000))


def _vectorize(text):
    char_indices = {c: i for i, c in enumerate(CHARS)}
    sentences = [text[i : i + MAXLEN] for i in range(0, len(text) - MAXLEN, 13)]
    next_chars = [text[i + MAXLEN] for i in range(0, len(text) - MAXLEN, 13)]
    x = np.zeros((len(sentences), MAXLEN, len(CHARS)), dtype="float32")
    y = np.zeros((len(sentences), len(CHARS)), dtype="float32")
    for i, sentence in enumerate(sentences):
        for t, char in enumerate(sentence):
            x[i, t, char_indices[char]] = 1
        y[i, char_indices[next_chars[i]]] = 1
    return x, y


def build():
    model = keras.Sequential(
        [
            keras.Input(shape=(MAXLEN, len(CHARS))),
            layers.LSTM(128),
            layers.Dense(len(CHARS), activation="softmax"),
        ]
    )
    model.compile(
        loss="categorical_crossentropy",
        optimizer=keras.optimizers.RMSprop(learning_rate=0.01),
    )
    x, y = _vectorize(_text())
    return model, x, y


if __name__ == "__main__":
    model, x, y = build()
    for epoch in range(2):
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)
        preds = model.predict(x[:1], verbose=0)[0]
        print("epoch", epoch, "next char", CHARS[int(np.argmax(preds))])
