"""TensorFlow's guide "Writing a training loop from scratch" (Keras 3).

A `tf.function` train step with `GradientTape`, the loss and a metric
updated by hand, a validation pass each epoch; the TARGET is the same model
compiled, for `tfdet check`.
"""

import keras
import numpy as np
import tensorflow as tf


def get_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    return keras.Model(inputs=inputs, outputs=outputs)


def _data():
    rng = np.random.default_rng(10)
    x = rng.random((320, 784), dtype=np.float32)
    y = rng.integers(0, 10, (320,))
    return x, y


def build():
    model = get_model()
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return (model, *_data())


if __name__ == "__main__":
    model = get_model()
    optimizer = keras.optimizers.SGD(learning_rate=1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
    x, y = _data()
    train_dataset = tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(64)
    val_dataset = tf.data.Dataset.from_tensor_slices((x[256:], y[256:])).batch(64)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        train_acc_metric.update_state(y, logits)
        return loss_value

    for epoch in range(2):
        for x_batch, y_batch in train_dataset:
            loss_value = train_step(x_batch, y_batch)
        train_acc_metric.reset_state()
        for x_batch, y_batch in val_dataset:
            model(x_batch, training=False)
        print("epoch", epoch, "loss", float(loss_value))
