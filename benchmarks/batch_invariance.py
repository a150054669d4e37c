"""Whether a sample's output bits follow the batch it was predicted in.

Usage:
    python benchmarks/batch_invariance.py [--batches 1,5,32] [--json FILE]
        [--settings plain,enable,tensorflow_ops] [--survey | --builtins]

For each setting, a fresh `sys.executable` process builds five small models
(an MLP with GELU; Conv2D + BatchNormalization + MaxPooling; MultiHeadAttention
+ LayerNormalization; LSTM; Embedding + pooling), predicts 96 inputs in one
batch of 96 and again, in another order, with `model.predict(x,
batch_size=B)` (and with `--batches call`, eagerly as `model(x[i:i+5])`),
and counts the rows whose output bits differ from the one-batch prediction. 0 in every cell
is batch invariance: a sample's bits do not depend on what else was in its
batch. The settings:

- plain: TensorFlow at its defaults, no tfdet;
- enable: `tfdet.enable()`, the default (every core, tfdet's kernels and
  the pool-size-free compositions);
- tensorflow_ops: `tfdet.enable(threads=1, patches=None)`, TensorFlow's own
  products and convolutions under op determinism (the control; before
  2026-12-07 the default's products were these);
- enable_one_thread: `tfdet.enable(threads=1)` (not in the default
  `--settings`).

`--cost` times instead `predict_on_batch` of 256 inputs in batches of B =
1, 32, 256 per model and setting, in one long-lived process per setting,
interleaved block by block, and prints each setting's ratio to plain
TensorFlow. `--survey` measures the op survey's 29 models (`survey_models.py`, each
with its 32 inputs) instead of the five, `--builtins` tfdet's built-in
targets that train under Keras 3 (their first synthesized batch). `--ops` prints instead, per op, the rows that differ when the op runs on the
first B rows of its input rather than on all of them (the forward products
that a Keras layer calls), under each setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = 96
# The survey's models come with their own inputs (`survey_models.SAMPLES`).
SURVEY_ROWS = 32

SETTINGS = {
    "plain": "",
    "enable": "import tfdet; tfdet.enable(seed=0)",
    "tensorflow_ops": "import tfdet; tfdet.enable(seed=0, threads=1, patches=None)",
    # The default on one thread (the bits do not follow the pool).
    "enable_one_thread": "import tfdet; tfdet.enable(seed=0, threads=1)",
}

# What each child process runs after its setting: one JSON line of counts.
MODELS_CHILD = r"""
import json, sys
import numpy as np
import keras
keras.utils.set_random_seed(0)
ROWS = int(sys.argv[1])
batches = [b if b == "call" else int(b) for b in sys.argv[2].split(",")]
rng = np.random.default_rng(0)

def mlp():
    m = keras.Sequential([keras.Input((24,)), keras.layers.Dense(64, "gelu"),
                          keras.layers.Dense(10)])
    return m, rng.standard_normal((ROWS, 24)).astype("float32")

def cnn():
    m = keras.Sequential([keras.Input((12, 12, 3)),
                          keras.layers.Conv2D(16, 3, padding="same"),
                          keras.layers.BatchNormalization(),
                          keras.layers.ReLU(), keras.layers.MaxPooling2D(),
                          keras.layers.Conv2D(24, 3, strides=2),
                          keras.layers.GlobalAveragePooling2D(),
                          keras.layers.Dense(10)])
    return m, rng.standard_normal((ROWS, 12, 12, 3)).astype("float32")

def attention():
    inp = keras.Input((10, 16))
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inp, inp)
    h = keras.layers.LayerNormalization()(h + inp)
    out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inp, out), rng.standard_normal((ROWS, 10, 16)).astype("float32")

def lstm():
    m = keras.Sequential([keras.Input((10, 8)), keras.layers.LSTM(32),
                          keras.layers.Dense(10)])
    return m, rng.standard_normal((ROWS, 10, 8)).astype("float32")

def embedding():
    m = keras.Sequential([keras.Input((12,), dtype="int32"),
                          keras.layers.Embedding(50, 16),
                          keras.layers.GlobalAveragePooling1D(),
                          keras.layers.Dense(10)])
    return m, rng.integers(0, 50, (ROWS, 12)).astype("int32")

def differing_rows(model, x, batch):
    # The split prediction takes the samples in another order, so each one
    # also sits elsewhere in its batch; "call" is `model(x[i : i + 5])`,
    # eagerly, slice by slice.
    whole = model.predict(x, batch_size=len(x), verbose=0)
    if batch == "call":
        split = np.concatenate([np.asarray(model(x[i : i + 5]))
                                for i in range(0, len(x), 5)])
    else:
        order = np.random.default_rng(1).permutation(len(x))
        split = np.empty_like(whole)
        split[order] = model.predict(x[order], batch_size=batch, verbose=0)
    return int(np.any(whole.reshape(len(x), -1).view(np.uint32)
                      != split.reshape(len(x), -1).view(np.uint32), axis=1).sum())

def survey():
    sys.path.insert(0, sys.argv[3])
    import survey_models
    for name, build in survey_models.NAMES.items():
        model, *data = build()
        if len(data) == 1:  # A dataset: its inputs, in the order it gives them.
            data = [np.concatenate([np.asarray(x) for x, _ in data[0]])]
        yield name, model, data[0]

def builtins():
    # tfdet's built-in targets that train under Keras 3, each predicting its
    # first synthesized batch.
    from tfdet._target import _builtins, _load
    for name in _builtins.names():
        if "tf_keras" not in name:
            built = _load.build(f"builtin:{name}", seed=0)
            yield f"builtin:{name}", built.model, np.asarray(built.batch(0)[0])

models = builtins() if sys.argv[3:] == ["builtins"] else survey() if sys.argv[3:] else (
    (build.__name__, *build()) for build in (mlp, cnn, attention, lstm, embedding))
counts = {}
for name, model, x in models:
    try:
        counts[name] = {batch: differing_rows(model, x, batch) for batch in batches}
    except Exception as error:  # One model's failure is its cell, not the run's.
        counts[name] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
print(json.dumps(counts))
"""

# A cost child: builds the five models, warms `predict_on_batch` at each
# batch size, then times one block per line it reads: per (model, B), the
# median ms of predicting 256 samples in batches of B.
COST_CHILD = (
    r"""
import json, statistics, sys, time
import numpy as np
import keras
keras.utils.set_random_seed(0)
batches = [int(b) for b in sys.argv[2].split(",")]
SAMPLES = 256
"""
    + MODELS_CHILD.split("counts = {}")[0].split("def differing_rows")[0]
    + r"""
ROWS = SAMPLES
models = {build.__name__: build() for build in (mlp, cnn, attention, lstm, embedding)}
def predict_all(model, x, batch):
    for start in range(0, SAMPLES, batch):
        model.predict_on_batch(x[start : start + batch])
for model, x in models.values():
    for batch in batches:
        predict_all(model, x, batch)
print("ready", flush=True)
for _ in sys.stdin:
    block = {}
    for name, (model, x) in models.items():
        for batch in batches:
            times = []
            for _ in range(3):
                started = time.perf_counter()
                predict_all(model, x, batch)
                times.append(1000 * (time.perf_counter() - started))
            block[f"{name} B={batch}"] = statistics.median(times)
    print(json.dumps(block), flush=True)
"""
)


OPS_CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
ROWS = int(sys.argv[1])
batches = [int(b) for b in sys.argv[2].split(",")]
rng = np.random.default_rng(0)
def arr(*shape):
    return tf.constant(rng.standard_normal(shape).astype(np.float32))

w, x = arr(64, 48), arr(ROWS, 64)
k3, img = arr(3, 3, 8, 16), arr(ROWS, 12, 12, 8)
k1 = arr(1, 1, 8, 16)
dw, kt = arr(3, 3, 8, 2), arr(3, 3, 4, 8)
vol, k5 = arr(ROWS, 6, 6, 6, 3), arr(3, 3, 3, 3, 4)
# Queries and keys side by side on axis 1, so a slice of rows keeps its pairs.
qk = arr(ROWS, 2, 2, 10, 8)
ops = {
    "MatMul": (lambda t: tf.matmul(t, w), x),
    "Conv2D 3x3": (lambda t: tf.nn.conv2d(t, k3, 1, "SAME"), img),
    "Conv2D 3x3 stride 2": (lambda t: tf.nn.conv2d(t, k3, 2, "VALID"), img),
    "Conv2D 1x1": (lambda t: tf.nn.conv2d(t, k1, 1, "SAME"), img),
    "BatchMatMul (attention scores)": (
        lambda t: tf.matmul(t[:, 0], t[:, 1], transpose_b=True), qk),
    "Einsum (attention scores)": (
        lambda t: tf.einsum("bhqd,bhkd->bhqk", t[:, 0], t[:, 1]), qk),
    "Sum over the last axis": (lambda t: tf.reduce_sum(t, -1), x),
    "Softmax": (lambda t: tf.nn.softmax(t), x),
    # One value per row: the tensor's length is the batch size.
    "Sigmoid (one column)": (lambda t: tf.sigmoid(t[:, :1]), x),
    "Exp (3 columns)": (lambda t: tf.exp(t[:, :3]), x),
    "Pow (one column)": (lambda t: tf.pow(tf.abs(t[:, :1]), 1.7), x),
    "DepthwiseConv2D": (
        lambda t: tf.nn.depthwise_conv2d(t, dw, [1, 1, 1, 1], "SAME"), img),
    "Conv2DTranspose stride 2": (
        lambda t: tf.nn.conv2d_transpose(
            t, kt, [t.shape[0], 24, 24, 4], 2, "SAME"), img),
    "Conv3D": (lambda t: tf.nn.conv3d(t, k5, [1] * 5, "SAME"), vol),
}
counts = {}
for name, (op, data) in ops.items():
    whole = np.asarray(op(data)).reshape(ROWS, -1).view(np.uint32)
    counts[name] = {}
    for batch in batches:
        parts = [np.asarray(op(data[i : i + batch])) for i in range(0, ROWS, batch)]
        split = np.concatenate(parts).reshape(ROWS, -1).view(np.uint32)
        counts[name][batch] = int(np.any(whole != split, axis=1).sum())
print(json.dumps(counts))
"""


def measure(setting: str, child: str, batches: list[int], *arguments: str) -> dict:
    """Row counts from one fresh process under `setting`."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), environment.get("PYTHONPATH")])
    )
    code = SETTINGS[setting] + "\n" + child
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(ROWS),
            ",".join(batches),
            *arguments,
        ],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"{setting}: the child failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def cost(batches: list[str], blocks: int, settings: list[str]) -> str:
    """Predict time per setting, interleaved block by block; ratios to plain.

    One long-lived process per setting; in each block every process times
    its predictions in turn (the order rotating), so a load that slows a
    block slows every setting in it. Per (model, B): the median over blocks
    of the ratio to plain TensorFlow in the same block, and its middle half
    (`tfdet._cost._measure.block_figures`, as `tfdet cost` computes them).
    """
    sys.path.insert(0, str(REPO))
    from tfdet._cost._measure import block_figures

    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), environment.get("PYTHONPATH")])
    )
    processes = {
        setting: subprocess.Popen(
            [
                sys.executable,
                "-c",
                SETTINGS[setting] + "\n" + COST_CHILD,
                "256",
                ",".join(batches),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for setting in settings
    }
    for setting, process in processes.items():
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"{setting}: the child failed to start")
    per_block: dict[str, list[dict[str, float]]] = {}
    for block in range(blocks):
        turn = settings[block % len(settings) :] + settings[: block % len(settings)]
        timed = {}
        for setting in turn:
            processes[setting].stdin.write("block\n")
            processes[setting].stdin.flush()
            timed[setting] = json.loads(processes[setting].stdout.readline())
        for case in timed[settings[0]]:
            per_block.setdefault(case, []).append(
                {setting: timed[setting][case] for setting in settings}
            )
    for process in processes.values():
        process.stdin.close()
        process.wait()
    baseline, others = settings[0], settings[1:]
    lines = [
        f"predict 256 samples in batches of B: ms ({baseline}), and the ratio "
        f"to it [middle half], median of {blocks} interleaved blocks",
        "",
        f"| model, B | {baseline} ms | " + " | ".join(others) + " |",
        "|---" * (len(others) + 2) + "|",
    ]
    for case, rows in per_block.items():
        base = block_figures(rows, baseline, baseline)
        cells = []
        for setting in others:
            figures = block_figures(rows, setting, baseline)
            cells.append(
                f"{figures.ratio:.2f}x [{figures.ratio_q1:.2f}-{figures.ratio_q3:.2f}]"
            )
        lines.append(f"| {case} | {base.ms_per_step:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(results: dict[str, dict], batches: list[str], rows: int | str = ROWS) -> str:
    """Markdown: one row per setting, one column per model, `a/b/c` per B."""
    names = list(next(iter(results.values())))
    lines = [
        f"rows (of {rows}) whose bits differ from all of them predicted as one "
        "batch, predicted in another order at batch size " + " / ".join(batches),
        "",
        "| | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for setting, counts in results.items():
        cells = [
            counts[n].get("error") or "/".join(str(counts[n][b]) for b in batches)
            for n in names
        ]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--batches",
        default="1,5,32",
        help="batch sizes, and 'call' for model(x[i:i+5]) eagerly",
    )
    parser.add_argument("--settings", default="plain,enable,tensorflow_ops")
    parser.add_argument("--ops", action="store_true", help="per op, not per model")
    parser.add_argument(
        "--survey",
        action="store_true",
        help="the op survey's models (benchmarks/survey_models.py, 32 inputs)",
    )
    parser.add_argument(
        "--builtins",
        action="store_true",
        help="tfdet's built-in targets that train under Keras 3, their first batch",
    )
    parser.add_argument(
        "--cost",
        action="store_true",
        help="time predict per setting instead (default batches 1,32,256)",
    )
    parser.add_argument("--blocks", type=int, default=7, help="--cost's blocks")
    parser.add_argument("--json", help="also write the counts to this file")
    args = parser.parse_args()
    batches = args.batches.split(",")
    if args.cost:
        if args.batches == parser.get_default("batches"):
            batches = ["1", "32", "256"]
        print(cost(batches, args.blocks, args.settings.split(",")))
        return
    child = OPS_CHILD if args.ops else MODELS_CHILD
    arguments = (
        ["builtins"]
        if args.builtins
        else [str(REPO / "benchmarks")]
        if args.survey
        else []
    )
    results = {
        setting: measure(setting, child, batches, *arguments)
        for setting in args.settings.split(",")
    }
    rows = (
        SURVEY_ROWS
        if args.survey
        else "each model's first batch"
        if args.builtins
        else ROWS
    )
    print(table(results, batches, rows=rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
