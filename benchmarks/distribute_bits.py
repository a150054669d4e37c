"""What decides the bits of tf.distribute training: one table, measured here.

Usage:
    python benchmarks/distribute_bits.py [--repeats 2] [--steps 4] [--json FILE]

Trains one small model (Conv2D + BatchNormalization + GELU + Dropout + Dense,
Adam, a global batch of 24) with `model.fit` under TensorFlow's own
strategies, every worker a fresh `sys.executable` process: a
`MultiWorkerMirroredStrategy` job of N processes on loopback (TF_CONFIG with
free 127.0.0.1 ports), or a `MirroredStrategy` over N logical CPU devices in
one process. Each row changes one setting from the first row (2 workers, AUTO
collectives, default packing, AUTO auto-sharding, samples from memory, tfdet
enabled; "TFRecord files" rows read the same samples, in the same order, from
4 files) and is run `--repeats` times; the table gives worker 0's weights
digest (sha256 of the final weights' bytes, 16 hex digits), whether all
workers of a run agree, whether the repeats agree, and whether the digest
equals the first row's.

A last section asks whether the replicas of one MirroredStrategy draw the same
random values (a Dropout mask per replica, in `strategy.run`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfdet._runner import _cluster  # noqa: E402

SEED = 7
GLOBAL_BATCH = 24  # Splits evenly among 1, 2, 3 and 4 replicas.
BASE = {
    "workers": 2,
    "replicas": 1,
    "implementation": "AUTO",
    "bytes_per_pack": 0,
    "shard": "AUTO",
    "enable": True,
    "reverse_start": False,
    "one_cpu": False,
    "data": "memory",
}
# (label, changes to BASE): one setting per row.
ROWS = [
    ("2 workers (base: AUTO, default packing, shard AUTO)", {}),
    ("collective implementation RING", {"implementation": "RING"}),
    ("bytes_per_pack 64 (many small packs)", {"bytes_per_pack": 64}),
    ("bytes_per_pack 1 MiB", {"bytes_per_pack": 1 << 20}),
    ("auto-shard DATA", {"shard": "DATA"}),
    ("auto-shard OFF", {"shard": "OFF"}),
    ("the same samples read from 4 TFRecord files", {"data": "files"}),
    ("4 TFRecord files, auto-shard FILE", {"data": "files", "shard": "FILE"}),
    ("worker 1 started first, 2 s before worker 0", {"reverse_start": True}),
    ("1 worker (MultiWorkerMirroredStrategy)", {"workers": 1}),
    ("3 workers", {"workers": 3}),
    ("1 process, 2 replicas (MirroredStrategy)", {"workers": 0, "replicas": 2}),
    ("1 process, 4 replicas (MirroredStrategy)", {"workers": 0, "replicas": 4}),
    ("1 process, no strategy", {"workers": 0, "replicas": 1}),
    ("every worker on 1 CPU (affinity)", {"one_cpu": True}),
    ("2 workers without tfdet (seeds only)", {"enable": False}),
    ("without tfdet, every worker on 1 CPU", {"enable": False, "one_cpu": True}),
    ("without tfdet, 4 TFRecord files", {"enable": False, "data": "files"}),
]
FILES = 4


def _child(config: dict[str, Any]) -> None:
    """One worker (or one process): trains and prints its digest as JSON."""
    if config["enable"]:
        import tfdet

        tfdet.enable(seed=SEED)
    import keras
    import numpy as np
    import tensorflow as tf

    if not config["enable"]:
        keras.utils.set_random_seed(SEED)
        # Keras 3.15's fit cannot run under MultiWorkerMirroredStrategy at all
        # (keras#20585); this fix changes no bits, only lets it run.
        from tfdet.patches import keras_multi_worker

        keras_multi_worker.PATCH.install()
    strategy = _strategy(tf, config)
    if config.get("draws"):
        print(json.dumps(_replica_draws(tf, keras, strategy)))
        return
    steps = config["steps"]
    rng = np.random.default_rng(0)
    x = rng.random((steps * GLOBAL_BATCH, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, steps * GLOBAL_BATCH)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential(
            [
                keras.Input((16, 16, 3)),
                keras.layers.Conv2D(8, 3),
                keras.layers.BatchNormalization(),
                keras.layers.Activation("gelu"),
                keras.layers.Dropout(0.25),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    dataset = _dataset(tf, config["data"], x, y).batch(GLOBAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, config["shard"]
    )
    history = model.fit(
        dataset.with_options(options),
        epochs=1,
        steps_per_epoch=steps,
        shuffle=False,
        verbose=0,
    )
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    print(
        json.dumps(
            {
                "digest": hashlib.sha256(weights).hexdigest()[:16],
                "loss": float(history.history["loss"][-1]),
            }
        )
    )


def _dataset(tf: Any, data: str, x: Any, y: Any) -> Any:
    """The samples `(x, y)` from memory, or written to and read back from
    `FILES` TFRecord files in order: the same elements either way."""
    if data == "memory":
        return tf.data.Dataset.from_tensor_slices((x, y))
    import tempfile

    import numpy as np

    folder = tempfile.mkdtemp(prefix="distribute_bits_")
    paths = []
    for part, indices in enumerate(np.array_split(np.arange(len(x)), FILES)):
        paths.append(os.path.join(folder, f"part{part}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for i in indices:
                writer.write(x[i].tobytes() + y[i].astype(np.int64).tobytes())
    sample_bytes = x[0].nbytes

    def parse(record: Any) -> Any:
        raw = tf.io.decode_raw(record, tf.uint8)
        pixels = tf.bitcast(tf.reshape(raw[:sample_bytes], (-1, 4)), tf.float32)
        label = tf.bitcast(tf.reshape(raw[sample_bytes:], (1, 8)), tf.int64)[0]
        return tf.reshape(pixels, x.shape[1:]), label

    return tf.data.TFRecordDataset(paths).map(parse)


def _strategy(tf: Any, config: dict[str, Any]) -> Any:
    if config["workers"]:
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=config["bytes_per_pack"],
            implementation=getattr(
                tf.distribute.experimental.CommunicationImplementation,
                config["implementation"],
            ),
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    replicas = config["replicas"]
    if replicas == 1 and not config.get("draws"):
        return None
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _replica_draws(tf: Any, keras: Any, strategy: Any) -> dict[str, Any]:
    """Whether the replicas of `strategy` draw equal Dropout masks."""
    with strategy.scope():
        dropout = keras.layers.Dropout(0.5)

    @tf.function
    def draw() -> Any:
        return strategy.run(lambda: dropout(tf.ones((1, 64)), training=True))

    try:
        masks = [mask.numpy() for mask in strategy.experimental_local_results(draw())]
    except Exception as error:  # noqa: BLE001 - the table reports what failed
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
    return {
        "equal_masks": all((mask == masks[0]).all() for mask in masks[1:]),
        "digest": hashlib.sha256(b"".join(m.tobytes() for m in masks)).hexdigest()[:16],
    }


def _run(config: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """Runs one configuration's processes; worker 0's result and agreement."""
    command = [sys.executable, __file__, "--child", json.dumps(config)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    workers = config["workers"]
    cpus = {min(os.sched_getaffinity(0))} if config["one_cpu"] else None

    def pin() -> None:  # Runs in the child before exec.
        if cpus:
            os.sched_setaffinity(0, cpus)

    if not workers:
        proc = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=pin,
        )
        return _result([proc])
    ports = _cluster.free_ports(workers)
    order = list(range(workers))[:: -1 if config["reverse_start"] else 1]
    processes = {}
    for index in order:
        processes[index] = subprocess.Popen(
            command,
            env={**env, "TF_CONFIG": _cluster.cluster_config(ports, index)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pin,
        )
        if config["reverse_start"]:
            time.sleep(2)
    finished = []
    for index in range(workers):
        out, err = processes[index].communicate(timeout=timeout)
        finished.append(
            subprocess.CompletedProcess(command, processes[index].returncode, out, err)
        )
    return _result(finished)


def _result(procs: list[subprocess.CompletedProcess]) -> dict[str, Any]:
    results = []
    for proc in procs:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit {proc.returncode}: {tail[0][:160]}"}
        results.append(json.loads(lines[-1]))
    first = results[0]
    return {**first, "workers_agree": all(r == first for r in results[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    rows = []
    base_digest = None
    for label, changes in ROWS:
        config = {**BASE, **changes, "steps": args.steps}
        started = time.monotonic()
        runs = [_run(config) for _ in range(args.repeats)]
        digests = [run.get("digest") for run in runs]
        base_digest = base_digest or digests[0]
        row = {
            "setting": label,
            "digest": digests[0] or runs[0]["error"],
            "workers_agree": all(run.get("workers_agree") for run in runs),
            "repeats_agree": len(set(digests)) == 1 and None not in digests,
            "equals_base": digests[0] == base_digest,
            "seconds": round(time.monotonic() - started, 1),
        }
        rows.append(row)
        print(
            f"| {label} | {row['digest']} | {row['workers_agree']} | "
            f"{row['repeats_agree']} | {row['equals_base']} |",
            flush=True,
        )
    for enable in (True, False):
        config = {**BASE, "workers": 0, "replicas": 2, "enable": enable, "draws": True}
        draws = _run(config)
        label = f"2 MirroredStrategy replicas draw equal Dropout masks ({'tfdet' if enable else 'seeds only'})"
        rows.append({"setting": label, **draws})
        print(f"| {label} | {draws} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
