"""Record a step trace with `tfdet.DeterminismCallback`, then check a re-run.

Usage:

    python examples/trace_and_compare.py             # both steps, then `tfdet diff`
    python examples/trace_and_compare.py record run.jsonl
    python examples/trace_and_compare.py compare run.jsonl rerun.jsonl

`record` trains a small CNN with `fit` under `tfdet.enable()` and writes
every step's loss, metric and weight bits to a trace. `compare` trains again,
in a new process (or on another machine), checking each step against the
trace as it happens: at the first difference, `on_divergence="raise"` raises
`tfdet.DivergenceError` with the step, the quantity and both values. Without
arguments, the script runs both in fresh processes and diffs the traces.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def train(trace: str, reference: str | None) -> None:
    import tfdet

    # First, before any model or tensor exists: seeds, threads, ISA, op determinism.
    tfdet.enable(seed=42)
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((256, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 256)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    callback = tfdet.DeterminismCallback(
        trace=trace, reference=reference, on_divergence="raise"
    )
    model.fit(
        x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[callback]
    )
    if reference is None:
        print(f"recorded {callback.steps_recorded} steps in {trace}")
    else:
        print(f"all {callback.steps_recorded} steps match {reference} bit for bit")


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "record":
        train(argv[2], None)
        return 0
    if len(argv) >= 4 and argv[1] == "compare":
        train(argv[3], argv[2])
        return 0
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory() as workdir:
        first = os.path.join(workdir, "run.jsonl")
        second = os.path.join(workdir, "rerun.jsonl")
        # `tfdet run` pins PYTHONHASHSEED and friends before Python starts.
        for args in (["record", first], ["compare", first, second]):
            command = [sys.executable, "-m", "tfdet", "run", "--seed", "42", "--"]
            command += [sys.executable, __file__, *args]
            subprocess.run(command, env=env, check=True)
        return subprocess.run(
            [sys.executable, "-m", "tfdet", "diff", first, second], env=env, check=False
        ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
