"""Whether the inter-op pool's size decides the bits: gradients in fresh processes.

Each process builds keras.applications.MobileNetV2 (96x96 images, 10
classes, weights=None), computes the gradients of one batch of 32 seeded
images `--calls` times (the first call is where oneDNN creates its
primitives), and prints a digest of each call's. Settings, each in
`--processes` fresh processes, one after the other:

- `inter=2`: TensorFlow with op determinism, seeds, oneDNN on and capped at
  AVX2 as tfdet's profile sets them, intra-op pool 2, inter-op pool 2 (what
  `tfdet.enable(threads=2)` pinned before it kept the inter-op pool at 1);
- `inter=1`: the same with an inter-op pool of 1;
- `inter=2, AddN in order`: `inter=2` with tfdet's opt-in patch
  `fixed_order_add_n` installed alone (TensorFlow's AddN sums from the input
  whose buffer it may reuse, which follows the schedule);
- `tfdet.enable(threads=2)` (inter-op pool 1);
- `tfdet.enable(threads=2)` with `fixed_order_add_n` (which sizes the
  inter-op pool with `threads`: 2);
- `kernels, inter=2`: `tfdet.enable(threads=2)` with tfdet's kernels and
  pool-size-free products (whose bits follow no pool size), its inter-op
  pool forced to 2 (a probe: tfdet does not offer it);
- `kernels, AddN in order`: the kernels with `fixed_order_add_n` (inter-op
  pool 2).

One digest per setting means its gradients repeated; more than one, that
they followed something else than the inputs (which threads oneDNN found
free when its first call ran; which ops ran side by side). `--onednn off`
runs every setting with TF_ENABLE_ONEDNN_OPTS=0.

    python benchmarks/inter_op_pool.py --processes 6
    python benchmarks/inter_op_pool.py --processes 2 --calls 4 --onednn off
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys

CHILD = """
import hashlib, sys
import numpy as np
KERNELS = ["auto", "pool_size_free_products", "fixed_order_products",
           "fixed_order_convolutions", "portable_kernels"]
if sys.argv[1].startswith("tfdet"):
    import tfdet
    patches = KERNELS if "kernels" in sys.argv[1] else ["auto"]
    if sys.argv[1] == "tfdet-kernels":
        from tfdet._setup import _pools
        _pools.INTER_OP_THREADS = 2
    if sys.argv[1].endswith("add-n"):
        patches = patches + ["fixed_order_add_n"]
    tfdet.enable(threads=2, onednn=None, patches=patches)
    import keras
    import tensorflow as tf
else:
    import keras
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(int(sys.argv[1][0]))
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    if sys.argv[1].endswith("add-n"):
        from tfdet.patches import fixed_order_add_n
        fixed_order_add_n.PATCH.install()
print("INTER", tf.config.threading.get_inter_op_parallelism_threads())
model = keras.applications.MobileNetV2(
    weights=None, input_shape=(96, 96, 3), classes=10
)
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 96, 96, 3)).astype("float32")
y = rng.integers(0, 10, 32)
loss = keras.losses.SparseCategoricalCrossentropy()

@tf.function
def gradients():
    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    return tape.gradient(value, model.trainable_variables)

for _ in range(int(sys.argv[2])):
    digest = hashlib.sha256(b"".join(np.asarray(g).tobytes() for g in gradients()))
    print("DIGEST", digest.hexdigest()[:16])
"""

SETTINGS = {
    "inter=2": "2",
    "inter=1": "1",
    "inter=2, AddN in order": "2-add-n",
    "tfdet.enable(threads=2)": "tfdet",
    "the same, AddN in order": "tfdet-add-n",
    "kernels, inter=2": "tfdet-kernels",
    "kernels, AddN in order": "tfdet-kernels-add-n",
}


def _gradient_digests(argument: str, calls: int, onednn: str) -> tuple[str, list[str]]:
    """(the inter-op pool's size in force, each call's digest) of one process."""
    env = dict(
        os.environ,
        TF_ENABLE_ONEDNN_OPTS="1" if onednn == "on" else "0",
        ONEDNN_MAX_CPU_ISA="AVX2",
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, argument, str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line.split() for line in out.splitlines()]
    inter = next(words[1] for words in lines if words[:1] == ["INTER"])
    return inter, [words[1] for words in lines if words[:1] == ["DIGEST"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--onednn", choices=("on", "off"), default="on")
    args = parser.parse_args()
    for name, argument in SETTINGS.items():
        digests, inter = collections.Counter(), set()
        for _ in range(args.processes):
            pool, calls = _gradient_digests(argument, args.calls, args.onednn)
            inter.add(pool)
            digests.update(calls)
        print(
            f"{name:26s} inter-op {'/'.join(sorted(inter))}: "
            f"{len(digests)} digest(s): {dict(digests)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
