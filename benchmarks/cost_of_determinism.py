"""What bit-for-bit reproducibility costs: step time of the built-in CNN.

Usage:
    python benchmarks/cost_of_determinism.py [--rounds 2] [--blocks 6]
        [--steps 8] [--batch-size 64] [--explain] [--target TARGET] [--json FILE]

(`gpu_cost.py` runs the same measurement for other models and configurations.)

Four configurations train `builtin:cnn` (the keras-team/keras#12724 CNN:
convolutions, max-pooling, Dropout, Dense 512, RMSprop) with `train_on_batch`
on batches of 64:

- plain TensorFlow defaults (seeds only: thread pools follow the cores,
  oneDNN uncapped, op determinism off);
- `tfdet.enable(threads=1)`, the portable default;
- `tfdet.enable(threads=N)`, N = the cores this process may use;
- `tfdet.enable(threads=N, patches=["auto", "pool_size_free_products"])`,
  whose bits are the same for every N (so N can be the cores);
- with `--explain`, also op determinism alone and `enable(threads=N,
  cpu_isa=None)`, which split the cost between op determinism, threads and
  the AVX2 cap.

Each configuration runs in its own fresh process. The processes start
together, warm up (tracing, first oneDNN primitives; not timed), then take
turns: in each block one process at a time runs `--steps` steps while the
others wait, the order rotating every block. A block's ratio to plain
TensorFlow compares steps timed seconds apart, so the load of a shared machine
hits all configurations alike; the table reports the median over blocks of
these ratios, and of each configuration's median ms/step. `--rounds` repeats
this with new processes; each process reports its weights' digest at the end,
so the table also says whether a configuration gave the same bits in every
round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfdet._cost import _measure  # noqa: E402
from tfdet._pin import _isa  # noqa: E402
from tfdet._pin._environment import DETERMINISM_VARIABLES  # noqa: E402

_CHILD = """
import hashlib, json, sys, time, warnings
warnings.simplefilter("ignore")
target, enable, warmup, batch_size = {target!r}, {enable!r}, {warmup!r}, {batch_size!r}
jit_compile = None
if enable is None:
    import keras
    keras.utils.set_random_seed(0)
elif enable == "op_determinism_only":
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
else:
    import tfdet
    enable = dict(enable)
    jit_compile = enable.pop("jit_compile", None)
    tfdet.enable(**enable)
import numpy as np
from tfdet._target import _load
built = _load.build(target)
if jit_compile is not None:
    # Before the first step, which traces the train function with it. Under
    # op determinism Keras keeps True only where tfdet's keras_xla_determinism
    # patch finds a deterministic XLA lowering for every layer.
    built.model.jit_compile = jit_compile
# The synthesized samples, repeated to the batch size.
x = np.resize(built.x, (batch_size, *built.x.shape[1:]))
y = np.resize(built.y, (batch_size, *built.y.shape[1:]))
for _ in range(warmup):
    built.model.train_on_batch(x, y)
# Whether Keras trains this configuration with XLA (it may turn XLA off
# under op determinism), then ready.
print(json.dumps({{"jit_compile": bool(getattr(built.model, "jit_compile", False))}}))
print("ready", flush=True)
# Protocol: the parent writes a step count; the child runs that many steps and
# answers with their times. An empty line ends it; the child then answers
# with the digest of its weights (every process of a configuration ran the
# same steps, so equal digests mean repeatable bits).
for line in sys.stdin:
    if not line.strip():
        break
    times = []
    for _ in range(int(line)):
        start = time.perf_counter()
        built.model.train_on_batch(x, y)  # Returns host values: the step is done.
        times.append(1000 * (time.perf_counter() - start))
    print(json.dumps(times), flush=True)
sha = hashlib.sha256()
for weight in built.model.get_weights():
    sha.update(np.ascontiguousarray(weight).tobytes())
print(json.dumps({{"digest": sha.hexdigest()[:16]}}), flush=True)
"""


def cores() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def environment() -> dict[str, str]:
    """A benchmark child's environment: plain, GPU shared, tfdet importable."""
    # Plain TensorFlow means plain: no determinism variable from the caller's
    # shell may leak into any configuration.
    env = {k: v for k, v in os.environ.items() if k not in DETERMINISM_VARIABLES}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # Several processes share a GPU: none may take all of its memory.
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    return env


class _Worker:
    """One configuration in its own fresh process, stepping on request."""

    def __init__(
        self, target: str, enable: dict | str | None, warmup: int, batch_size: int
    ) -> None:
        code = _CHILD.format(
            target=target, enable=enable, warmup=warmup, batch_size=batch_size
        )
        self._process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _read(self) -> str:
        line = self._process.stdout.readline()
        if not line:
            self._process.kill()
            raise RuntimeError(
                f"benchmark run failed:\n{self._process.stderr.read()[-3000:]}"
            )
        return line

    def wait_ready(self) -> bool:
        """Waits for the warm-up; whether Keras trains with XLA."""
        jit_compile = False
        while (line := self._read().strip()) != "ready":
            if line.startswith('{"jit_compile"'):
                jit_compile = json.loads(line)["jit_compile"]
        return jit_compile

    def steps(self, count: int) -> list[float]:
        self._process.stdin.write(f"{count}\n")
        self._process.stdin.flush()
        return json.loads(self._read())

    def finish(self) -> str:
        """Ends the stepping; the digest of the process's weights."""
        self._process.stdin.write("\n")
        self._process.stdin.flush()
        digest = json.loads(self._read())["digest"]
        self.close()
        return digest

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._process.stdin.write("\n")
                self._process.stdin.flush()
                self._process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._process.kill()


def configurations(cores: int, explain: bool) -> dict[str, dict | str | None]:
    """Name -> what the child does: None (seeds only) or `enable()` kwargs."""
    configs: dict[str, dict | str | None] = {
        "plain TensorFlow defaults": None,
        "enable(threads=1)": {"threads": 1},
        f"enable(threads={cores})": {"threads": cores},
        # Bits that do not follow the pool size: the same at any N.
        f"enable(threads={cores}) + pool-size-free": {
            "threads": cores,
            "patches": ["auto", "pool_size_free_products"],
        },
    }
    if explain:
        # Split the cost: op determinism alone, and the AVX2 cap (default) vs
        # an uncapped oneDNN at the same thread count.
        configs["op determinism only"] = "op_determinism_only"
        configs[f"enable(threads={cores}, cpu_isa=None)"] = {
            "threads": cores,
            "cpu_isa": None,
        }
    return configs


def measure(
    rounds: int,
    blocks: int,
    steps: int,
    warmup: int,
    batch_size: int,
    explain: bool = False,
    target: str = "builtin:cnn",
    configs: dict[str, dict | str | None] | None = None,
) -> dict:
    """Runs every configuration, interleaved block by block; returns the figures.

    Args:
        rounds, blocks, steps, warmup, batch_size: See the module docstring.
        explain: Adds the configurations that split the cost (when `configs`
            is None).
        target: The TARGET every configuration trains.
        configs: Name -> None (seeds only), "op_determinism_only", or
            `enable()` keyword arguments (plus "jit_compile": set on the
            model before its first step); the first is the baseline of the
            ratios. None: `configurations(cores(), explain)`.
    """
    available = cores()
    configs = configurations(available, explain) if configs is None else configs
    names = list(configs)
    per_block: list[dict[str, float]] = []
    digests: dict[str, list[str]] = {name: [] for name in names}
    xla: dict[str, bool] = {}
    for round_ in range(rounds):
        workers = {
            name: _Worker(target, config, warmup, batch_size)
            for name, config in configs.items()
        }
        try:
            for name, worker in workers.items():
                xla[name] = worker.wait_ready()
                # A process that never gets ready shows as the missing line.
                print(
                    f"  {target} round {round_ + 1}/{rounds}: {name} ready "
                    f"(XLA {'on' if xla[name] else 'off'})",
                    flush=True,
                )
            for block in range(blocks):
                shift = (round_ * blocks + block) % len(names)
                medians = {
                    name: statistics.median(workers[name].steps(steps))
                    for name in names[shift:] + names[:shift]
                }
                per_block.append(medians)
                print(
                    f"  {target} round {round_ + 1}/{rounds} block {block + 1}/"
                    f"{blocks}: "
                    + ", ".join(f"{name} {medians[name]:.1f}" for name in names)
                    + " ms/step",
                    flush=True,
                )
            for name, worker in workers.items():
                digests[name].append(worker.finish())
        finally:
            for worker in workers.values():
                worker.close()
    return {
        "target": target,
        "batch_size": batch_size,
        "rounds": rounds,
        "blocks_per_round": blocks,
        "steps_per_block": steps,
        "warmup_steps": warmup,
        "cores": available,
        "cpu_model": _isa.cpu_model(),
        "per_block_ms": per_block,
        "table": table(per_block, digests, xla),
    }


def table(
    per_block: list[dict[str, float]],
    digests: dict[str, list[str]],
    xla: dict[str, bool],
) -> dict[str, dict]:
    """Per configuration (the first is the baseline): its figures, as tfdet
    cost reports them, with its digests and whether Keras used XLA."""
    baseline = next(iter(digests))
    return {
        name: {
            # Median ms/step, the median of the block ratios and their middle
            # half (how stable the figure is).
            **dataclasses.asdict(_measure.block_figures(per_block, name, baseline)),
            # One per round (a fresh process each): all equal = repeatable.
            "digests": digests[name],
            "repeatable": len(set(digests[name])) == 1,
            "xla": xla[name],
        }
        for name in digests
    }


def format_table(figures: dict, device: str | None = None) -> str:
    """The ratio table, plain text.

    Args:
        figures: What `measure` returned.
        device: What ran the steps, for the heading; None: the CPU.
    """
    blocks = figures["rounds"] * figures["blocks_per_round"]
    device = device or f"{figures['cores']} cores ({figures['cpu_model']})"
    lines = [
        f"{figures['target']}, batch {figures['batch_size']}, {device}; {blocks} "
        f"interleaved blocks of {figures['steps_per_block']} steps in "
        f"{figures['rounds']} rounds of fresh processes, after "
        f"{figures['warmup_steps']} warm-up steps",
        "",
        f"{'configuration':<36}{'ms/step':>9}{'ratio':>8}  middle half  XLA  "
        "same bits in every round",
    ]
    for name, row in figures["table"].items():
        rounds = len(row["digests"])
        if rounds < 2:
            same = "not compared (1 process)"
        else:
            same = ("yes" if row["repeatable"] else "NO") + f" ({rounds} processes)"
        lines.append(
            f"{name:<36}{row['ms_per_step']:>9.2f}{row['ratio']:>8.2f}  "
            f"{row['ratio_q1']:.2f}-{row['ratio_q3']:.2f}    "
            f"{'on ' if row['xla'] else 'off'}  {same}"
        )
    return "\n".join(lines)


def add_schedule_arguments(
    parser: argparse.ArgumentParser,
    rounds: int = 2,
    blocks: int = 6,
    steps: int = 8,
    batch_size: int = 64,
) -> None:
    """The flags of `measure`'s schedule, with these defaults."""
    parser.add_argument(
        "--rounds", type=int, default=rounds, help="Rounds of fresh processes."
    )
    parser.add_argument(
        "--blocks", type=int, default=blocks, help="Interleaved blocks per round."
    )
    parser.add_argument(
        "--steps", type=int, default=steps, help="Timed steps per block."
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="Untimed steps per process."
    )
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help="Samples per step."
    )


def check_schedule_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    """Exits with a usage error for a schedule `measure` cannot run."""
    if (
        min(args.rounds, args.blocks, args.steps, args.batch_size) < 1
        or args.warmup < 0
    ):
        parser.error("rounds, blocks, steps and batch size must be >= 1, warm-up >= 0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_schedule_arguments(parser)
    parser.add_argument(
        "--explain",
        action="store_true",
        help="Also time op determinism alone and enable() without the AVX2 cap.",
    )
    parser.add_argument(
        "--target",
        default="builtin:cnn",
        help="The TARGET to train (default builtin:cnn; e.g. "
        "benchmarks/survey_models.py:multi_head_attention).",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="Also write the figures as JSON."
    )
    args = parser.parse_args(argv)
    check_schedule_arguments(parser, args)
    figures = measure(
        args.rounds,
        args.blocks,
        args.steps,
        args.warmup,
        args.batch_size,
        args.explain,
        target=args.target,
    )
    print()
    print(format_table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
