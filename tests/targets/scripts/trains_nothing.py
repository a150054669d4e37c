"""A script that builds a model and never trains it."""

import keras

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
print(model.count_params())
