"""A script that does to its own process what scripts do, then trains.

It starts a helper it never waits for (as one starts TensorBoard), forks a
child that exits at once with status 0, and sends its own stdout to a log
file and closes it. Under `python unruly_process.py` it trains 2 steps and
exits 0; none of this may change how tfdet judges it.
"""

import os
import subprocess
import sys

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)

sys.stdout = open("train.log", "w")  # noqa: SIM115 - closed below, as scripts do
print("training")
sys.stdout.close()

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(2)
x = np.linspace(0, 1, 32, dtype=np.float32).reshape(16, 2)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
