"""Bit-for-bit reproducible Keras training: copy this file, keep the first lines.

Trains a small CNN on synthetic MNIST-like data (28x28 grayscale digits drawn
from a seeded generator, so nothing is downloaded) and prints the final loss
with its exact bits and a SHA-256 of every weight. Run it twice, on machines
with different core counts, or with `taskset -c 0` and without: the two lines
are identical.

    python examples/train_reproducibly.py
    taskset -c 0 python examples/train_reproducibly.py   # same output

For the hash seed too (dict/set order in your own code), start it with
`tfdet run examples/train_reproducibly.py`, which sets PYTHONHASHSEED before
Python starts; plain `python` gives a warning saying so.
"""

from __future__ import annotations

import argparse
import hashlib

import tfdet


def synthetic_digits(count: int, seed: int):
    """Images that are noise plus a class-dependent stripe, and their labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    images = rng.random((count, 28, 28, 1), dtype=np.float32) * 0.5
    for index, label in enumerate(labels):
        images[index, 2 + 2 * label : 4 + 2 * label, :, 0] += 0.5  # Learnable signal.
    return images, labels.astype(np.int32)


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def weights_sha256(model) -> str:
    """One hash over the exact bytes of every weight, in order."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    # First, before any model, tensor or dataset exists: seeds Python, NumPy,
    # TensorFlow and Keras, turns on op determinism, pins the thread pools and
    # oneDNN's instruction set. `threads` fixes the bits, not the machine: any
    # fixed N gives the same bits on 1 core or 64.
    profile = tfdet.enable(seed=args.seed, threads=args.threads)

    x, y = synthetic_digits(1024, seed=args.seed)
    model = build_model()
    history = model.fit(
        x, y, batch_size=64, epochs=args.epochs, shuffle=True, verbose=0
    )

    import numpy as np

    loss = np.float32(history.history["loss"][-1])
    print(f"profile: {profile}")
    print(f"final loss: {loss} (float32 bits {loss.view(np.uint32):08x})")
    print(f"weights sha256: {weights_sha256(model)}")


if __name__ == "__main__":
    main()
