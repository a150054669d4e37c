"""Are cuDNN LSTM/GRU bits repeatable under TF op determinism alone?

Usage:
    python benchmarks/cudnn_rnn_repeatability.py [--processes 5]
        [--parallel 5] [--flavors keras3,tf_keras]
        [--modes op_determinism,tfdet,tfdet_cudnn_rnn_patch] [--json FILE]

Keras's cuDNN RNN kernels were reported not to repeat their bits
(tensorflow/tensorflow#59281); tfdet's `cudnn_rnn` patch replaces them with
Keras's generic loop, at ~8x per step. On an NVIDIA H200 (TF 2.21, cuDNN
9.3) every configuration below repeated under op determinism, so the patch
is opt-in; this script gathers the same evidence on another GPU or cuDNN. Each fresh
process (`--processes` of them per Keras flavor and mode, `--parallel` at a
time on one GPU) trains every configuration below, one after the other from
the same seed, and prints a digest of each model's final weights; a
configuration is repeatable when every process gave one digest.

Configurations: LSTM, GRU, `return_sequences`, bidirectional LSTM and GRU,
masked variable-length sequences (Embedding with `mask_zero`, right-padded),
stacked LSTM+GRU; each trained with `train_on_batch` (4 steps) and with `fit`
(one epoch of 4 shuffled batches). Modes: seeds + op determinism
(`op_determinism`); the default `tfdet.enable()`, which keeps cuDNN
(`tfdet`); and `tfdet.enable(patches=["auto", "cudnn_rnn"])`
(`tfdet_cudnn_rnn_patch`, no cuDNN op left). The table also says whether the traced
training step holds a cuDNN RNN op (only meaningful on a GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost_of_determinism  # noqa: E402  (its child environment is reused)

FLAVORS = ("keras3", "tf_keras")
MODES = ("op_determinism", "tfdet", "tfdet_cudnn_rnn_patch")

_CHILD = """
import hashlib, json, os, warnings
warnings.simplefilter("ignore")
mode = {mode!r}
if mode == "op_determinism":
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()
else:
    # enable() before `import tensorflow`: it pins oneDNN's custom ops.
    import tfdet
    patches = ["auto", "cudnn_rnn"] if mode == "tfdet_cudnn_rnn_patch" else "auto"
    tfdet.enable(seed=0, patches=patches)
import numpy as np
import tensorflow as tf
if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras
else:
    import keras
from tfdet._graph import _scan

gpu = bool(tf.config.list_physical_devices("GPU"))
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 20, 8)).astype("float32")
tokens = rng.integers(1, 50, (64, 20))
lengths = rng.integers(5, 21, 64)
tokens[np.arange(20) >= lengths[:, None]] = 0  # Right-padded: cuDNN's layout.
y = rng.integers(0, 3, 64)
L = keras.layers


def sequential(*layers, inputs=(20, 8)):
    return [keras.Input(inputs), *layers, L.Dense(3)]


CONFIGURATIONS = {{
    "lstm": lambda: sequential(L.LSTM(32)),
    "gru": lambda: sequential(L.GRU(32)),
    "lstm_return_sequences": lambda: sequential(
        L.LSTM(32, return_sequences=True), L.GlobalAveragePooling1D()
    ),
    "bidirectional_lstm": lambda: sequential(L.Bidirectional(L.LSTM(32))),
    "bidirectional_gru": lambda: sequential(L.Bidirectional(L.GRU(32))),
    "masked_lstm": lambda: [
        keras.Input((20,), dtype="int32"), L.Embedding(50, 8, mask_zero=True),
        L.LSTM(32), L.Dense(3),
    ],
    "stacked_lstm_gru": lambda: sequential(
        L.LSTM(32, return_sequences=True), L.GRU(16)
    ),
}}
results = {{}}
for name, layers in CONFIGURATIONS.items():
    data = tokens if name.startswith("masked") else x
    for method in ("train_on_batch", "fit"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(layers())
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        if method == "fit":
            model.fit(data, y, batch_size=16, epochs=1, shuffle=True, verbose=0)
        else:
            for step in range(4):
                batch = slice(16 * step, 16 * (step + 1))
                model.train_on_batch(data[batch], y[batch])
        sha = hashlib.sha256()
        for weight in model.get_weights():
            sha.update(np.ascontiguousarray(weight).tobytes())
        graph, _ = _scan.trace_train_step(model, data[:16], y[:16])
        cudnn = gpu and any(
            node.op_type.startswith("CudnnRNN") for node in _scan.walk(graph)
        )
        results[f"{{name}} {{method}}"] = {{
            "digest": sha.hexdigest()[:16], "cudnn": cudnn,
        }}
print(json.dumps({{"gpu": gpu, "results": results}}))
"""


def _environment(flavor: str) -> dict[str, str]:
    env = cost_of_determinism.environment()
    env["TF_USE_LEGACY_KERAS"] = "1" if flavor == "tf_keras" else "0"
    return env


def one_process(flavor: str, mode: str) -> dict:
    """Trains every configuration in a fresh process; its digests."""
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD.format(mode=mode))],
        env=_environment(flavor),
        capture_output=True,
        text=True,
        check=False,
    )
    lines = process.stdout.strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(
            f"{flavor}/{mode} process exited {process.returncode}:\n"
            f"{process.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def tf_keras_installed() -> bool:
    try:
        import importlib.metadata

        importlib.metadata.version("tf_keras")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def measure(
    processes: int, parallel: int, flavors: list[str], modes: list[str]
) -> dict:
    """`{flavor: {mode: {"gpu": bool, "configurations": {name: row}}}}`."""
    figures: dict = {}
    for flavor in flavors:
        if flavor == "tf_keras" and not tf_keras_installed():
            figures[flavor] = {"skipped": "tf_keras is not installed"}
            continue
        for mode in modes:
            with ThreadPoolExecutor(parallel) as pool:
                futures = [
                    pool.submit(one_process, flavor, mode) for _ in range(processes)
                ]
                runs = [future.result() for future in futures]
            configurations = {}
            for name in runs[0]["results"]:
                digests = [run["results"][name]["digest"] for run in runs]
                configurations[name] = {
                    "digests": digests,
                    "distinct": len(set(digests)),
                    "cudnn": all(run["results"][name]["cudnn"] for run in runs),
                }
            figures.setdefault(flavor, {})[mode] = {
                "gpu": runs[0]["gpu"],
                "configurations": configurations,
            }
            print(format_table(flavor, mode, figures[flavor][mode], processes))
            print(flush=True)
    return figures


def format_table(flavor: str, mode: str, figures: dict, processes: int) -> str:
    """One line per configuration: repeatable or not, cuDNN or not."""
    where = "GPU" if figures["gpu"] else "no GPU (CPU kernels: not the question)"
    lines = [
        f"{flavor}, {mode}, {processes} fresh processes, {where}",
        f"{'configuration':<40}{'same bits':<22}cuDNN op in the step",
    ]
    for name, row in figures["configurations"].items():
        same = (
            f"yes ({processes}/{processes})"
            if row["distinct"] == 1
            else f"NO ({row['distinct']} digests)"
        )
        lines.append(f"{name:<40}{same:<22}{'yes' if row['cudnn'] else 'no'}")
    return "\n".join(lines)


def _names(text: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{flag}: unknown {unknown or 'empty'}; known: {', '.join(known)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=5)
    parser.add_argument("--flavors", default=",".join(FLAVORS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.processes < 2 or args.parallel < 1:
        parser.error("--processes must be >= 2 and --parallel >= 1")
    try:
        flavors = _names(args.flavors, FLAVORS, "--flavors")
        modes = _names(args.modes, MODES, "--modes")
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    figures = measure(args.processes, args.parallel, flavors, modes)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
