"""Multi-worker training with the same bits twice: MultiWorkerMirroredStrategy.

Usage:

    python examples/train_multi_worker.py              # 2 jobs of 2 workers, then `tfdet diff`
    python examples/train_multi_worker.py --workers 3

Each job is a real `tf.distribute.MultiWorkerMirroredStrategy` cluster: one
fresh process per worker, told its place by `TF_CONFIG`, talking over
127.0.0.1. Every worker calls `tfdet.enable()` first (seeds, threads, ISA,
and RING all-reduce in place of TensorFlow's device-dependent AUTO), builds
and compiles its model inside `strategy.scope()`, trains with `fit`, and
records a trace with `tfdet.DeterminismCallback`. The launcher runs the job
twice and compares worker 0's traces with `tfdet diff`.

The bits are those of this worker count: another number of workers splits
the global batch another way and sums the gradients in another order.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

GLOBAL_BATCH = 32


def train(trace: str) -> None:
    import tfdet

    tfdet.enable(seed=42)  # First: before TensorFlow starts.
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.random((8 * GLOBAL_BATCH, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 8 * GLOBAL_BATCH)
    # Every worker reads the same global batches; tf.distribute gives each
    # its share (auto-sharding by data).
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(
        dataset,
        epochs=2,
        verbose=0,
        callbacks=[tfdet.DeterminismCallback(trace)],
    )


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def run_job(workers: int, directory: str) -> str:
    """Starts one job of `workers` processes; returns worker 0's trace."""
    ports = _free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index in range(workers):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        trace = os.path.join(directory, f"worker{index}.jsonl")
        processes.append(
            subprocess.Popen(
                [sys.executable, __file__, "--train", trace],
                env={**os.environ, "TF_CONFIG": json.dumps(config)},
            )
        )
    codes = [process.wait() for process in processes]
    if any(codes):
        sys.exit(f"a worker failed: exit codes {codes}")
    return os.path.join(directory, "worker0.jsonl")


def main() -> None:
    if sys.argv[1:2] == ["--train"]:
        train(sys.argv[2])
        return
    workers = int(sys.argv[2]) if sys.argv[1:2] == ["--workers"] else 2
    root = tempfile.mkdtemp(prefix="tfdet-multi-worker-")
    traces = []
    for job in ("first", "second"):
        directory = os.path.join(root, job)
        os.makedirs(directory)
        traces.append(run_job(workers, directory))
    diff = [sys.executable, "-m", "tfdet", "diff", *traces]
    sys.exit(subprocess.run(diff, check=False).returncode)


if __name__ == "__main__":
    main()
