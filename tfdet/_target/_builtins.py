"""Built-in TARGETs (`builtin:NAME`), so `tfdet check` works out of the box.

`cnn` is a Keras 3 port of the model in keras-team/keras#12724: the
issue where every seed was set and the loss of the second `train_on_batch`
still came out as one of two values. The `keras_issue*` targets reproduce that
issue's exact scenario as regression tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from tfdet._errors import TargetError


@dataclasses.dataclass(frozen=True)
class Builtin:
    """A built-in target.

    Attributes:
        name: Name after `builtin:`.
        function: Returns a compiled model or `(model, x, y)`.
        description: One line for `tfdet check --help`.
        legacy_keras: Needs `TF_USE_LEGACY_KERAS=1` (tf_keras).
    """

    name: str
    function: Callable[[], Any]
    description: str
    legacy_keras: bool = False


def _cnn_layers(layers: Any) -> list[Any]:
    """The keras-team/keras#12724 CNN body, for Keras 3 or tf_keras `layers`."""
    return [
        layers.Conv2D(32, (3, 3), padding="same", activation="relu"),
        layers.Conv2D(32, (3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Dropout(0.25),
        layers.Conv2D(64, (3, 3), padding="same", activation="relu"),
        layers.Conv2D(64, (3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Dropout(0.25),
        layers.Flatten(),
        layers.Dense(512, activation="relu"),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ]


def _keras3_cnn(metrics: list[Any]) -> Any:
    import keras

    model = keras.Sequential([keras.Input((32, 32, 3)), *_cnn_layers(keras.layers)])
    # Keras 2's RMSprop(decay=1e-6) is lr / (1 + decay * iterations).
    schedule = keras.optimizers.schedules.InverseTimeDecay(1e-4, 1, 1e-6)
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=schedule),
        loss="categorical_crossentropy",
        metrics=metrics,
    )
    return model


def cnn() -> Any:
    """Keras 3 CNN: convolutions, max-pooling, three Dropouts, Dense 512.

    RMSprop with the issue's inverse-time decay (lr=1e-4, decay=1e-6),
    categorical cross-entropy, categorical accuracy and hinge metrics. Data is
    synthesized (random images, one-hot labels).
    """
    return _keras3_cnn(["categorical_accuracy", "categorical_hinge"])


def cnn_tf_keras() -> Any:
    """The same CNN in tf_keras (Keras 2), legacy RMSprop with `decay`."""
    import tf_keras

    model = tf_keras.Sequential(
        [tf_keras.Input((32, 32, 3)), *_cnn_layers(tf_keras.layers)]
    )
    model.compile(
        optimizer=tf_keras.optimizers.legacy.RMSprop(learning_rate=1e-4, decay=1e-6),
        loss="categorical_crossentropy",
        metrics=["categorical_accuracy", "categorical_hinge"],
    )
    return model


def embedding() -> Any:
    """Embedding + pooling + Dense, Adam, binary cross-entropy, AUC.

    Exercises sparse (IndexedSlices) gradients, Adam's slots and the AUC
    metric's thresholded accumulators.
    """
    import keras

    model = keras.Sequential(
        [
            keras.Input((20,), dtype="int32"),
            keras.layers.Embedding(1000, 16),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), "binary_accuracy"],
    )
    return model


def bn_gelu() -> Any:
    """Conv2D + BatchNormalization + GELU, Adam with ExponentialDecay.

    Small on purpose (16x16x3 images, 8 filters, about 2,000 weights): a model
    of the kind whose weights differed between an AMD EPYC and an Intel Xeon
    under the same profile, while plain Conv2D/Dense models with SGD matched.
    Fixed data (a seeded generator), so its digests can be compared across
    machines (benchmarks/portability.py).
    """
    import keras

    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, (3, 3), padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("gelu"),
            keras.layers.Conv2D(8, (3, 3)),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("gelu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(16, activation="gelu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, 2, 0.9)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=schedule),
        loss="categorical_crossentropy",
        metrics=["categorical_accuracy"],
    )
    rng = np.random.default_rng(12724)
    x = rng.standard_normal((128, 16, 16, 3), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    return model, x, y


def _keras_issue_data() -> tuple[np.ndarray, np.ndarray]:
    # The issue's data: ones / 255, every label class 0, two batches of 32.
    x = np.ones((64, 32, 32, 3), dtype=np.float32) / 255.0
    y = np.zeros((64, 10), dtype=np.float32)
    y[:, 0] = 1.0
    return x, y


def keras_issue() -> Any:
    """keras-team/keras#12724 exactly, in Keras 3 (regression test)."""
    import keras

    # The issue used categorical_accuracy twice; Keras 3 needs unique names.
    metrics = [
        keras.metrics.CategoricalAccuracy(name="categorical_accuracy"),
        keras.metrics.CategoricalAccuracy(name="categorical_accuracy_2"),
        "categorical_hinge",
    ]
    return (_keras3_cnn(metrics), *_keras_issue_data())


def keras_issue_tf_keras() -> Any:
    """keras-team/keras#12724 in tf_keras, eager `train_on_batch`."""
    return (cnn_tf_keras(), *_keras_issue_data())


def keras_issue_tf_keras_graph() -> Any:
    """keras-team/keras#12724 in tf_keras under `tf.compat.v1` graph mode.

    The closest TF 2 equivalent of the issue's TF 1.13 session: eager
    execution is disabled before the model is built.
    """
    import tensorflow as tf
    import tf_keras

    from tfdet._setup._enable import profile

    tf.compat.v1.disable_eager_execution()
    # A new default graph has no global seed: seed it again, as the session
    # code of the issue did.
    active = profile()
    tf_keras.utils.set_random_seed(active.seed if active is not None else 0)
    return (cnn_tf_keras(), *_keras_issue_data())


_BUILTINS = {
    builtin.name: builtin
    for builtin in (
        Builtin("cnn", cnn, "Keras 3 CNN of keras-team/keras#12724 (the default)."),
        Builtin("embedding", embedding, "Keras 3 Embedding + Adam + AUC."),
        Builtin(
            "bn_gelu",
            bn_gelu,
            "Keras 3 Conv2D + BatchNorm + GELU, Adam with ExponentialDecay.",
        ),
        Builtin("cnn_tf_keras", cnn_tf_keras, "The CNN in tf_keras (Keras 2).", True),
        Builtin(
            "keras_issue", keras_issue, "keras-team/keras#12724 scenario, Keras 3."
        ),
        Builtin(
            "keras_issue_tf_keras",
            keras_issue_tf_keras,
            "keras-team/keras#12724 scenario, tf_keras eager.",
            True,
        ),
        Builtin(
            "keras_issue_tf_keras_graph",
            keras_issue_tf_keras_graph,
            "keras-team/keras#12724 scenario, tf_keras in tf.compat.v1 graph mode.",
            True,
        ),
    )
}


def names() -> list[str]:
    """Names of the built-in targets."""
    return list(_BUILTINS)


def get(name: str) -> Builtin:
    """The built-in target `name`.

    Raises:
        TargetError: unknown name, listing the known ones.
    """
    try:
        return _BUILTINS[name]
    except KeyError:
        raise TargetError(
            f"Expected a built-in target, one of {', '.join(_BUILTINS)}. "
            f"Received: builtin:{name}"
        ) from None


def describe() -> str:
    """`name: description` lines for help texts."""
    return "\n".join(f"builtin:{b.name}: {b.description}" for b in _BUILTINS.values())
