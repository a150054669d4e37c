"""TARGETs whose training steps reach every GPU determinism hazard tfdet patches.

`keras3` builds a Keras 3 model, `tf_keras` the same in tf_keras (run with
`TF_USE_LEGACY_KERAS=1`). Both use Resizing (nearest) and UpSampling2D (which
resizes only in tf_keras), CategoryEncoding in count mode, RandomContrast, a
frozen BatchNormalization, an IoU metric and an Embedding trained with Adam:
the entry points known to reach refused ops in TF 2.21. `nested` hides a nearest resize inside a
nested `tf.function` (its gradient is a separate library function);
`extras` reaches the crop-and-resize and sparse-matmul backprops;
`recurrent_keras3` and `recurrent_tf_keras` reach the cuDNN LSTM and GRU
kernels that a GPU would run; `bidirectional_keras3` wraps them in two
`Bidirectional`s whose names collide with TensorFlow's scopes.
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
    # Keras 3's UpSampling2D repeats instead of resizing; tf_keras' resizes.
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
    return (
        model,
        rng.random((8, 4, 4, 2), dtype=np.float32),
        rng.random((8, 1), dtype=np.float32),
    )


def extras() -> tuple[Any, list[np.ndarray], np.ndarray]:
    """Keras 3 model reaching the crop-and-resize and sparse-matmul backprops.

    An ROI crop (`tf.image.crop_and_resize`, as in detection heads) of a
    trainable convolution, and a graph convolution (a fixed sparse adjacency
    matrix times trainable node features, `tf.sparse.sparse_dense_matmul`).
    """
    import keras
    import tensorflow as tf

    nodes, features = 6, 5

    class RoiCrop(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            batch = tf.shape(x)[0]
            boxes = tf.tile(tf.constant([[0.1, 0.2, 0.8, 0.9]]), [batch, 1])
            return tf.image.crop_and_resize(x, boxes, tf.range(batch), (4, 4))

        def compute_output_shape(self, input_shape: Any) -> Any:
            return (input_shape[0], 4, 4, input_shape[3])

    class GraphConv(keras.layers.Layer):
        def build(self, input_shape: Any) -> None:
            self.kernel = self.add_weight(shape=(features, features), name="kernel")

        def call(self, x: Any) -> Any:
            adjacency = tf.sparse.SparseTensor(
                [[0, 1], [1, 0], [1, 2], [2, 1], [3, 4], [4, 5], [5, 3]],
                [1.0] * 7,
                [nodes, nodes],
            )
            h = tf.matmul(x, self.kernel)  # [batch, nodes, features]
            # Nodes first, so one sparse matmul serves the whole batch.
            stacked = tf.reshape(tf.transpose(h, [1, 0, 2]), [nodes, -1])
            mixed = tf.sparse.sparse_dense_matmul(adjacency, stacked)
            return tf.transpose(tf.reshape(mixed, [nodes, -1, features]), [1, 0, 2])

        def compute_output_shape(self, input_shape: Any) -> Any:
            return input_shape

    image = keras.Input((8, 8, 3), name="image")
    graph = keras.Input((nodes, features), name="graph")
    x = keras.layers.Conv2D(2, 3, padding="same", name="conv")(image)
    x = keras.layers.Flatten()(RoiCrop(name="roi_crop")(x))
    g = keras.layers.Flatten()(GraphConv(name="graph_conv")(graph))
    output = keras.layers.Dense(1, name="head")(keras.layers.Concatenate()([x, g]))
    model = keras.Model([image, graph], output, name="extras")
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    data = [
        rng.random((8, 8, 8, 3), dtype=np.float32),
        rng.random((8, nodes, features), dtype=np.float32),
    ]
    return model, data, rng.random((8, 1), dtype=np.float32)


def _recurrent(keras: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    # Default LSTM/GRU settings are the ones cuDNN accepts, so on a GPU both
    # layers would run CudnnRNNV3 (Keras 3 decides when tracing, tf_keras
    # leaves the choice to Grappler).
    sequence = keras.Input((7, 3), name="sequence")
    x = keras.layers.LSTM(6, return_sequences=True, name="lstm")(sequence)
    x = keras.layers.GRU(5, name="gru")(x)
    output = keras.layers.Dense(1, name="head")(x)
    model = keras.Model(sequence, output, name="recurrent")
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return (
        model,
        rng.standard_normal((8, 7, 3)).astype(np.float32),
        rng.standard_normal((8, 1)).astype(np.float32),
    )


def recurrent_keras3() -> tuple[Any, np.ndarray, np.ndarray]:
    """Keras 3 LSTM + GRU: the cuDNN path a GPU would take."""
    import keras

    return _recurrent(keras)


def recurrent_tf_keras() -> tuple[Any, np.ndarray, np.ndarray]:
    """tf_keras LSTM + GRU: the cuDNN twins Grappler would pick on a GPU."""
    import tf_keras

    return _recurrent(tf_keras)


def bidirectional_keras3() -> tuple[Any, np.ndarray, np.ndarray]:
    """Keras 3 `Bidirectional(LSTM)` then `Bidirectional(GRU)`.

    The second wrapper is auto-named `bidirectional_1`, which is also the
    scope TensorFlow gives the first wrapper's scope when it is opened a
    second time: name matching would blame the GRU's wrapper for the LSTM.
    """
    import keras

    sequence = keras.Input((7, 3), name="sequence")
    x = keras.layers.Bidirectional(keras.layers.LSTM(6, return_sequences=True))(
        sequence
    )
    x = keras.layers.Bidirectional(keras.layers.GRU(5))(x)
    output = keras.layers.Dense(1, name="head")(x)
    model = keras.Model(sequence, output, name="birecurrent")
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return (
        model,
        rng.standard_normal((8, 7, 3)).astype(np.float32),
        rng.standard_normal((8, 1)).astype(np.float32),
    )
