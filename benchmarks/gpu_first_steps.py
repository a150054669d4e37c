"""When each of the first training steps ends in a fresh process, on the GPU.

Plain TensorFlow (no tfdet), the built-in CNN (`builtin:cnn`), one
`train_on_batch` step at a time: seconds from the start of the process to
`import tensorflow`, the model built, and each step's end. Run under TF's
defaults and under `TF_DETERMINISTIC_OPS=1`, in fresh processes one after
another, it tells a first run that is slow (kernels JIT-compiled from PTX,
cuDNN and XLA autotuning: the next process is faster, from the CUDA cache)
from a run that hangs (a Python stack is dumped every `--dump` seconds);
`--no-xla` trains without XLA, and `XLA_FLAGS=--xla_gpu_autotune_level=0`
with XLA but without its autotuning.

    python3 benchmarks/gpu_first_steps.py --steps 3 --dump 60 [--no-xla]
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time

START = time.perf_counter()


def _say(what: str) -> None:
    print(f"{time.perf_counter() - START:8.1f} s  {what}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dump", type=float, default=60.0)
    parser.add_argument(
        "--no-xla",
        action="store_true",
        help="train with jit_compile=False (Keras's 'auto' uses XLA on a GPU)",
    )
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.dump, repeat=True, file=sys.stderr)
    import tensorflow as tf

    _say(
        f"imported TensorFlow {tf.__version__}; GPUs {tf.config.list_physical_devices('GPU')}"
    )
    from tfdet._target import _load

    built = _load.build("builtin:cnn", seed=0)
    if args.no_xla:
        built.model.jit_compile = False
    _say(f"built builtin:cnn (jit_compile={built.model.jit_compile})")
    for step in range(args.steps):
        x, y = built.batch(step)[:2]
        loss = built.model.train_on_batch(x, y)
        _say(
            f"step {step} done, loss {float(loss if not isinstance(loss, list) else loss[0]):.6f}"
        )
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
