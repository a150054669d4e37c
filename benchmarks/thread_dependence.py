"""Which ops' bits follow the thread-pool size, under tfdet's default profile.

Usage:
    python benchmarks/thread_dependence.py [--threads 1,2,3,4,8]
        [--patches auto,pool_size_free_products] [--json FILE]

For each pool size N, a fresh `sys.executable` process calls
`tfdet.enable(seed=0, threads=N)` (oneDNN's custom ops on, capped at AVX2,
op determinism, Eigen's cache sizes pinned) and computes every op below on
the same inputs, forward and gradient, printing one sha256 digest (16 hex
digits) per result. An op whose digests differ between two pool sizes has
bits that follow the pool size; the table lists, per op, the groups of N
that agree. Op determinism makes each N repeat itself; this measures only
whether N itself decides the bits (the thread-count issue: today
`enable()` defaults to one thread because of it). `--patches` is passed to
`enable(patches=...)`: with the opt-in `pool_size_free_products`, the table
is what still follows the pool size.

The shapes are those of small training steps (batch 32), large enough that
a kernel has work to split across threads: a product whose summed
dimension is split changes its summation order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What each child process runs: one digest per op result.
CHILD = r"""
import hashlib, json, sys
import tfdet
tfdet.enable(seed=0, threads=int(sys.argv[1]), patches=sys.argv[2].split(","))
import numpy as np
import tensorflow as tf
import keras

rng = np.random.default_rng(0)
def arr(*shape):
    return tf.constant(rng.standard_normal(shape).astype(np.float32))
def digest(t):
    return hashlib.sha256(np.ascontiguousarray(np.asarray(t)).tobytes()).hexdigest()[:16]

out = {}
def record(name, t):
    if t is None:  # No gradient (integer input).
        return
    out[name] = digest(tf.convert_to_tensor(t))  # IndexedSlices too.

def grads(name, fn, *inputs):
    # The op's full output is compared; the gradients are those of the sum
    # of its squares, so they depend on the output, not on how a sum of it
    # was reduced.
    with tf.GradientTape() as tape:
        for x in inputs:
            tape.watch(x)
        y = fn(*inputs)
        loss = tf.reduce_sum(y * y)
    record(name, y)
    for i, g in enumerate(tape.gradient(loss, list(inputs))):
        record(f"{name} grad[{i}]", g)

a, b = arr(32, 4096), arr(4096, 64)
grads("MatMul 32x4096x64", tf.matmul, a, b)
x, w = arr(8, 32, 32, 64), arr(3, 3, 64, 64)
grads("Conv2D 8x32x32x64 3x3x64", lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), x, w)
x2, w2 = arr(32, 14, 14, 256), arr(1, 1, 256, 128)
grads("Conv2D 1x1 32x14x14x256", lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), x2, w2)
big = arr(256, 4096)
out["Sum (all)"] = digest(tf.reduce_sum(big))
out["Sum (all) of 3000001"] = digest(tf.reduce_sum(arr(3000001)))
out["Sum over axis 0"] = digest(tf.reduce_sum(big, axis=0))
out["Sum over axis 1"] = digest(tf.reduce_sum(big, axis=1))
out["Mean (all)"] = digest(tf.reduce_mean(big))
bias_in = arr(32, 16, 16, 128)
grads("BiasAdd", tf.nn.bias_add, bias_in, arr(128))
grads("BatchMatMul 16x(64x256 @ 256x64)", tf.matmul, arr(16, 64, 256), arr(16, 256, 64))
grads("Einsum attention scores", lambda q, k: tf.einsum("aecd,abcd->acbe", k, q),
      arr(32, 64, 4, 32), arr(32, 64, 4, 32))
grads("DepthwiseConv2D 3x3 32x16x16x64",
      lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME"),
      arr(32, 16, 16, 64), arr(3, 3, 64, 1))
grads("Conv3D 3x3x3 8x8x16x16x16", lambda x, w: tf.nn.conv3d(x, w, [1] * 5, "SAME"),
      arr(8, 8, 16, 16, 16), arr(3, 3, 3, 16, 32))
grads("Conv2DTranspose 3x3/2 16x16x16x64",
      lambda x, w: tf.nn.conv2d_transpose(x, w, [16, 32, 32, 32], 2, "SAME"),
      arr(16, 16, 16, 64), arr(3, 3, 32, 64))

def layer(name, make, x):
    model_layer = make()
    model_layer.build(x.shape)
    weights = model_layer.trainable_variables
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = model_layer(x, training=True)
        loss = tf.reduce_sum(y * y)
    record(name, y)
    for i, g in enumerate(tape.gradient(loss, [x] + weights)):
        record(f"{name} grad[{'input' if i == 0 else weights[i - 1].name}]", g)

keras.utils.set_random_seed(0)
layer("BatchNormalization", lambda: keras.layers.BatchNormalization(), arr(32, 16, 16, 64))
layer("LayerNormalization", lambda: keras.layers.LayerNormalization(), arr(32, 128, 256))
layer("Dense 4096->256", lambda: keras.layers.Dense(256), arr(32, 4096))
layer("Embedding 10000x64", lambda: keras.layers.Embedding(10000, 64),
      tf.constant(rng.integers(0, 10000, (32, 200))))
layer("LSTM 64", lambda: keras.layers.LSTM(64), arr(32, 20, 64))
layer("GRU 64", lambda: keras.layers.GRU(64), arr(32, 20, 64))
layer("Conv1D 5 32x100x64", lambda: keras.layers.Conv1D(64, 5), arr(32, 100, 64))
layer("SeparableConv2D 3x3 16x16x16x64",
      lambda: keras.layers.SeparableConv2D(64, 3), arr(16, 16, 16, 64))
class SelfAttention(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.attention = keras.layers.MultiHeadAttention(4, 32)
    def build(self, shape):
        self.attention.build(shape, shape)
    def call(self, x, training=False):
        return self.attention(x, x, training=training)
layer("MultiHeadAttention 4x32", SelfAttention, arr(16, 64, 128))
logits, labels = arr(32, 1000), tf.constant(rng.integers(0, 1000, 32))
grads("softmax", tf.nn.softmax, logits)
grads("sparse softmax cross-entropy", lambda z:
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels, z), logits)

var = tf.Variable(arr(4096, 256))
grad = arr(4096, 256)
adam = keras.optimizers.Adam(1e-3)
rms = keras.optimizers.RMSprop(1e-3)
v2 = tf.Variable(var)
for _ in range(3):
    adam.apply([grad], [var])
    rms.apply([grad], [v2])
out["Adam update 4096x256"] = digest(var)
out["RMSprop update 4096x256"] = digest(v2)
print(json.dumps(out))
"""


def digests(threads: int, patches: str = "auto") -> dict[str, str]:
    """The op digests of one fresh process with `enable(threads=threads)`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), patches],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"threads={threads} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def groups(by_threads: dict[int, dict[str, str]], op: str) -> list[list[int]]:
    """The pool sizes that agree on `op`, grouped (one group: independent)."""
    seen: dict[str, list[int]] = {}
    for threads, ops in by_threads.items():
        seen.setdefault(ops[op], []).append(threads)
    return list(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2,3,4,8")
    parser.add_argument("--patches", default="auto", help="enable(patches=...)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sizes = [int(n) for n in args.threads.split(",")]
    by_threads = {n: digests(n, args.patches) for n in sizes}
    ops = list(by_threads[sizes[0]])
    width = max(len(op) for op in ops)
    print(f"{'op':<{width}}  pool sizes that agree ({', '.join(map(str, sizes))})")
    for op in ops:
        agree = groups(by_threads, op)
        verdict = (
            "independent"
            if len(agree) == 1
            else " | ".join(",".join(map(str, group)) for group in agree)
        )
        print(f"{op:<{width}}  {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(by_threads, indent=2))


if __name__ == "__main__":
    main()
