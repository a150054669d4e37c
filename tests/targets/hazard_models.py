"""TARGETs whose training steps reach every GPU determinism hazard tfdet patches.

`keras3` builds a Keras 3 model, `tf_keras` the same in tf_keras (run with
`TF_USE_LEGACY_KERAS=1`). Both use nearest-neighbour resizing (Resizing and,
in tf_keras, UpSampling2D), CategoryEncoding in count mode, RandomContrast, a
frozen BatchNormalization, an IoU metric and an Embedding trained with Adam:
the entry points FACTS.md lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_SAMPLES = 16
_IMAGE = (8, 8, 3)
_TOKENS = 6
_VOCAB = 12
_CLASSES = 3


def _data() -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.random((_SAMPLES, *_IMAGE), dtype=np.float32)
    tokens = rng.integers(0, _VOCAB, size=(_SAMPLES, _TOKENS)).astype(np.int32)
    labels = rng.integers(0, _CLASSES, size=(_SAMPLES,)).astype(np.int32)
    return [images, tokens], labels


def _build(keras: Any, legacy: bool) -> Any:
    layers = keras.layers
    image = keras.Input(_IMAGE, name="image")
    tokens = keras.Input((_TOKENS,), dtype="int32", name="tokens")

    x = layers.RandomContrast(0.5, seed=1, name="contrast")(image)
    # Trainable convolution before the resize, so the resize's gradient is
    # needed; frozen BN after it (training=False while its weights train).
    x = layers.Conv2D(4, 3, padding="same", name="conv")(x)
    x = layers.Resizing(12, 12, interpolation="nearest", name="resize")(x)
    if legacy:
        x = layers.UpSampling2D(2, name="upsample")(x)
    else:
        x = layers.UpSampling2D(2, name="upsample")(x)
    frozen = layers.BatchNormalization(name="frozen_bn")
    x = frozen(x, training=False)
    x = layers.GlobalAveragePooling2D(name="pool")(x)

    counts = layers.CategoryEncoding(_VOCAB, output_mode="count", name="counts")(tokens)
    embedded = layers.Embedding(_VOCAB, 4, name="embedding")(tokens)
    embedded = layers.GlobalAveragePooling1D(name="embedding_pool")(embedded)

    merged = layers.Concatenate(name="merge")([x, counts, embedded])
    output = layers.Dense(_CLASSES, activation="softmax", name="head")(merged)
    model = keras.Model([image, tokens], output, name="hazards")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss="sparse_categorical_crossentropy",
        metrics=[
            keras.metrics.MeanIoU(num_classes=_CLASSES, sparse_y_pred=False, name="iou")
        ],
    )
    return model


def keras3() -> tuple[Any, list[np.ndarray], np.ndarray]:
    """Keras 3 model reaching DenseBincount, ResizeNearestNeighborGrad, ScatterNd."""
    import keras

    return (_build(keras, legacy=False), *_data())


def tf_keras() -> tuple[Any, list[np.ndarray], np.ndarray]:
    """tf_keras model: also UpSampling2D, AdjustContrastv2, frozen fused BN,
    ResourceScatterAdd from Adam's IndexedSlices update."""
    import tf_keras

    return (_build(tf_keras, legacy=True), *_data())


def nested() -> tuple[Any, np.ndarray, np.ndarray]:
    """Keras 3 model whose nearest resize runs inside a nested `tf.function`.

    Its gradient is then a separate gradient function in the library: the
    scan must look inside it and attribute it to the layer that called it.
    """
    import keras
    import tensorflow as tf

    @tf.function
    def upscale(x: Any) -> Any:
        return tf.image.resize(x, (8, 8), method="nearest")

    class NestedResize(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            return upscale(x)

        def compute_output_shape(self, input_shape: Any) -> Any:
            return (input_shape[0], 8, 8, input_shape[3])

    image = keras.Input((4, 4, 2))
    x = keras.layers.Conv2D(2, 1, name="conv")(image)
    x = NestedResize(name="nested_resize")(x)
    x = keras.layers.Flatten()(x)
    output = keras.layers.Dense(1, name="head")(x)
    model = keras.Model(image, output, name="nested")
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    return model, rng.random((8, 4, 4, 2), dtype=np.float32), rng.random((8, 1), dtype=np.float32)
