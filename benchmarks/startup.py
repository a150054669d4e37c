"""Where a fresh process's seconds go under `tfdet.enable()`.

Usage:
    python benchmarks/startup.py [--rounds N]

Runs N alternating pairs of fresh processes (`sys.executable`, this file
with `--child`). Each imports tfdet, calls `enable()`, and fits a small Keras
CNN (Conv2D, BatchNormalization, Dense; 256 samples, 3 epochs, batch 32).
`frozen` is enable() as it is: TensorFlow's import runs with the garbage
collector paused, then what exists is frozen (`gc.freeze()`); `collected`
undoes that (the collector runs throughout, as before). Each line gives the
process's wall time from its start to its exit, the time in `enable()`, and
the collector's passes and seconds by generation (`gc.callbacks`). Both end
the way tfdet's own children do, without the interpreter's teardown.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time


def child(setting: str) -> None:
    """One measured process: enable(), then a small fit."""
    passes = {0: 0, 1: 0, 2: 0}
    seconds = {0: 0.0, 1: 0.0, 2: 0.0}
    started = [0.0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            passes[info["generation"]] += 1
            seconds[info["generation"]] += time.perf_counter() - started[0]

    gc.callbacks.append(watch)
    import tfdet
    from tfdet._setup import _collector

    if setting == "collected":
        _collector.paused_then_frozen = contextlib.nullcontext
    began = time.perf_counter()
    tfdet.enable()
    enabled = time.perf_counter() - began

    import keras
    import numpy as np

    data = np.random.default_rng(0).normal(size=(256, 16, 16, 3)).astype("float32")
    labels = np.arange(256) % 10
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, labels, epochs=3, batch_size=32, verbose=0)
    report = {
        "enable_s": round(enabled, 2),
        "collector": {
            f"gen{generation}": [passes[generation], round(seconds[generation], 2)]
            for generation in passes
        },
    }
    print(json.dumps(report), flush=True)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["frozen", "collected"])
    args = parser.parse_args()
    if args.child:
        child(args.child)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(args.rounds):
        for setting in ("frozen", "collected"):
            began = time.perf_counter()
            output = subprocess.run(
                [sys.executable, __file__, "--child", setting],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            wall = time.perf_counter() - began
            print(f"{setting:9} {wall:5.2f} s  {output.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
