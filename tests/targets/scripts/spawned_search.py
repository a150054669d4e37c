"""A hyper-parameter search's shape: workers of multiprocessing pools.

Each worker (a "spawn" Pool, a "forkserver" ProcessPoolExecutor) reports
tfdet's seed in it and one draw of an unseeded random op, into a file named
for the parent's PID under the directory given as the first argument; the
parent then trains a small model, so that the check has steps to compare.
"""

import concurrent.futures
import json
import multiprocessing
import os
import sys


def draw(method):
    import tensorflow as tf

    import tfdet

    profile = tfdet.profile()
    return {
        "method": method,
        "seed": None if profile is None else profile.seed,
        # Under TF_DETERMINISTIC_OPS an unseeded op raises; under the
        # profile the global seed decides this draw.
        "draw": float(tf.random.uniform([])),
    }


if __name__ == "__main__":
    import keras
    import numpy as np

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seen = pool.map(draw, ["spawn"])
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("forkserver")
    ) as executor:
        seen.append(executor.submit(draw, "forkserver").result())
    with open(os.path.join(sys.argv[1], f"{os.getpid()}.json"), "w") as out:
        json.dump(seen, out)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0)
