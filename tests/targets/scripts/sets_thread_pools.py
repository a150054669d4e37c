"""Sets TensorFlow's intra-op pool to the size given as its argument, then trains."""

import sys

import keras
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
x = np.ones((8, 2), dtype=np.float32)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], epochs=1, verbose=0)
print("pool", tf.config.threading.get_intra_op_parallelism_threads())
