"""Whether oneDNN decides a model's bits on this CPU: one digest per setting.

Usage:
    python benchmarks/onednn_bits.py on|off

Trains a small Conv2D + BatchNormalization + GELU + Dense model for 4
`train_on_batch` steps under `tfdet.enable(seed=7, onednn=...)` in this
process and prints the ISA oneDNN would use, whether its custom ops are on,
and the sha256 of the final weights (16 hex digits). Run it fresh for each
setting and each CPU: on aarch64, emulated CPU models are picked with
`QEMU_CPU` (`ci/aarch64.py`), e.g.

    QEMU_CPU=neoverse-n1 .venv-matrix/2.21-aarch64-emulated/venv/bin/python \\
        benchmarks/onednn_bits.py off
"""

from __future__ import annotations

import hashlib
import sys

import tfdet


def main(setting: str) -> str:
    tfdet.enable(seed=7, onednn=setting == "on")
    import keras
    import numpy as np

    from tfdet._pin import _environment

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, 32)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(16, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("gelu"),
            keras.layers.Conv2D(32, 3, strides=2),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    for _ in range(4):
        model.train_on_batch(x, y)
    weights = b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
    isa = _environment.cpu_facts()["cpu_isa_in_force"]
    on = _environment.onednn_custom_ops()
    return f"onednn={setting} isa={isa} custom_ops={on} {hashlib.sha256(weights).hexdigest()[:16]}"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("on", "off"):
        sys.exit(__doc__)
    print(main(sys.argv[1]))
