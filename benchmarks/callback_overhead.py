"""Cost of `tfdet.DeterminismCallback(every=1)` on `fit` step time.

Usage:

    python benchmarks/callback_overhead.py [--steps 30] [--repeats 7] [--threads 1]

Two models, in one process, under `tfdet.enable()`: the built-in CNN
(keras-team/keras#12724, ~1.2M parameters) and a 4.2M-parameter MLP. For
each, `fit` runs over the same batches with and without the callback
(writing a trace, every step), and with an empty batch-end hook (the part of
the cost that any per-step callback pays in Keras 3), alternating runs so
that a busy neighbour slows all alike; the figure is the median ms/step of
each, the ratio with/without the callback, and the ratio of the best
(fastest) times, which a busy machine disturbs least.
The last line is the same table as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def _mlp() -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((1024,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def _data(model: Any, steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    x = rng.random((steps * batch, *shape), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, steps * batch)]
    return x, y


def _sync_only() -> Any:
    """A callback with an empty `on_train_batch_end`.

    Any batch-end hook makes Keras 3 hand over each step's logs synchronously
    instead of dispatching them in the background; this isolates that cost
    from the callback's own work.
    """
    import keras

    class SyncOnly(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            pass

    return SyncOnly()


def _time_fit(model: Any, x: Any, y: Any, batch: int, callbacks: list[Any]) -> float:
    started = time.perf_counter()
    model.fit(
        x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks
    )
    return time.perf_counter() - started


def _time_hook(callback: Any) -> list[float]:
    """Accumulates the seconds spent inside the callback's batch-end hook.

    Its own cost per step, immune to the swings of the fit step itself (on
    these shared machines a plain fit jumps between two speeds from one call
    to the next).
    """
    spent = [0.0]
    hook = callback.on_train_batch_end

    def timed(batch: int, logs: Any = None) -> None:
        started = time.perf_counter()
        hook(batch, logs)
        spent[0] += time.perf_counter() - started

    callback.on_train_batch_end = timed
    return spent


def measure(name: str, model: Any, steps: int, repeats: int, batch: int = 32) -> dict:
    """Median ms/step of `fit` without and with the callback, and the ratio."""
    import tfdet

    x, y = _data(model, steps, batch)
    with tempfile.TemporaryDirectory() as workdir:
        trace = os.path.join(workdir, "trace.jsonl")
        callback = tfdet.DeterminismCallback(trace=trace, every=1)
        # Warm-up: trace the train function and the checksum function once.
        _time_fit(model, x[: 2 * batch], y[: 2 * batch], batch, [callback])
        sync = _sync_only()
        spent = _time_hook(callback)
        plain, synced, traced, hook = [], [], [], []
        for _ in range(repeats):
            plain.append(_time_fit(model, x, y, batch, []) / steps)
            synced.append(_time_fit(model, x, y, batch, [sync]) / steps)
            spent[0] = 0.0
            traced.append(_time_fit(model, x, y, batch, [callback]) / steps)
            hook.append(spent[0] / steps)
        with open(trace, encoding="utf-8") as written:
            lines = sum(1 for _ in written) - 1
    assert lines == steps, f"expected {steps} trace lines, found {lines}"
    without = statistics.median(plain) * 1e3
    with_cb = statistics.median(traced) * 1e3
    sync_only = statistics.median(synced) * 1e3
    own = statistics.median(hook) * 1e3
    return {
        "model": name,
        "parameters": int(model.count_params()),
        "variables": len(model.weights),
        "ms_per_step_without": round(without, 2),
        "ms_per_step_empty_hook": round(sync_only, 2),
        "ms_per_step_with": round(with_cb, 2),
        "ratio": round(with_cb / without, 3),
        "callback_ms_per_step": round(own, 2),
        # The callback's own time added to the plain step: the steadiest figure.
        "ratio_own": round((without + own) / without, 3),
        # Best-of ratio: least disturbed by other processes on a shared machine.
        "ratio_best": round(min(traced) / min(plain), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="Batches per timed fit.")
    parser.add_argument("--repeats", type=int, default=7, help="Rounds per model.")
    parser.add_argument(
        "--threads", type=int, default=1, help="tfdet.enable(threads=N)."
    )
    args = parser.parse_args()
    import tfdet

    tfdet.enable(seed=0, threads=args.threads)
    from tfdet._target import _builtins

    rows = [
        measure("builtin:cnn", _builtins.cnn(), args.steps, args.repeats),
        measure("mlp_4m", _mlp(), args.steps, args.repeats),
    ]
    print(
        f"fit step time, batch 32, tfdet.enable(threads={args.threads}), median of {args.repeats}"
    )
    print(
        f"{'model':<12} {'params':>10} {'without':>10} {'empty hook':>11} "
        f"{'with tfdet':>11} {'ratio':>7} {'best-of':>8} {'hook':>9} {'own ratio':>9}"
    )
    for row in rows:
        print(
            f"{row['model']:<12} {row['parameters']:>10,} {row['ms_per_step_without']:>8.2f}ms"
            f" {row['ms_per_step_empty_hook']:>9.2f}ms {row['ms_per_step_with']:>9.2f}ms"
            f" {row['ratio']:>7.3f} {row['ratio_best']:>8.3f}"
            f" {row['callback_ms_per_step']:>7.2f}ms {row['ratio_own']:>9.3f}"
        )
    print(json.dumps({"threads": args.threads, "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
