"""A training whose bits follow every perturbation that can change bits.

The control of the perturbation tests: without tfdet, each of `caches`,
`affinity`, `threads` and `hashseed` must make two runs of it differ, as a
TARGET (`perturbation_control.py:build`) and as a script (`python
perturbation_control.py`) alike. What follows each (measured on AMD EPYC
Zen 3 and Zen 4, TensorFlow 2.21 CPU):

- `hashseed`: the input's feature groups are ordered by iterating a set of
  strings, as code that collects feature names in a set does;
- `affinity` and `threads`: a Dense layer over 16384 inputs (its matrix
  product splits the sum among the threads of the pool) and a mean over the
  whole batch (a full reduction, sharded by the pool size), where
  TensorFlow's default pools follow the CPUs a process may use;
- `caches`: a convolution whose filter gradient Eigen blocks by the L1
  cache size (with oneDNN's custom ops off and one thread per pool).
"""

from __future__ import annotations

from typing import Any

import numpy as np

GROUPS = 8
FEATURES = 16384


def build() -> tuple[Any, np.ndarray, np.ndarray]:
    """The model and one batch of data, its features ordered by a set."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, GROUPS, FEATURES // GROUPS)).astype(np.float32)
    # A set of names decides the order of the feature groups.
    order = [int(name[1:]) for name in {f"g{k}" for k in range(GROUPS)}]
    x = x[:, order, :].reshape(32, FEATURES)
    y = rng.integers(0, 3, size=(32,)).astype(np.int32)

    inputs = keras.Input((FEATURES,))
    wide = keras.layers.Dense(4, name="wide")(inputs)
    image = keras.layers.Reshape((32, 32, 16))(inputs)
    image = keras.layers.Lambda(
        lambda t: t + 1e-3 * keras.ops.mean(t), name="whole_batch_mean"
    )(image)
    image = keras.layers.Conv2D(16, 3, activation="relu", name="conv")(image)
    image = keras.layers.GlobalAveragePooling2D()(image)
    outputs = keras.layers.Dense(3, name="head")(
        keras.layers.Concatenate()([wide, image])
    )
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, x, y


if __name__ == "__main__":
    import keras

    keras.utils.set_random_seed(0)
    model, x, y = build()
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
