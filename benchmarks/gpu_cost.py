"""What determinism costs on a GPU: TF defaults, op determinism and tfdet.

Usage:
    python benchmarks/gpu_cost.py [--targets conv,rnn,attention,builtin:cnn]
        [--rounds 3] [--blocks 4] [--steps 10] [--warmup 5] [--batch-size 32]
        [--explain] [--check] [--json FILE]

For each model (`benchmarks/gpu_models.py`: a Conv2D/BatchNorm/MaxPool model,
a cuDNN LSTM+GRU model, a MultiHeadAttention/LayerNorm/GELU model; and
`builtin:cnn`), three configurations train side by side with
`train_on_batch`, each in its own fresh process, interleaved block by block as
in `cost_of_determinism.py` (a block's ratio compares steps timed seconds
apart):

- TF defaults: Keras seeds only (Keras may compile with XLA: "auto");
- op determinism: seeds + `tf.config.experimental.enable_op_determinism()`
  (Keras then turns XLA off);
- `tfdet.enable()`: the default profile.

`--explain` adds `tfdet.enable()` with the opt-in `cudnn_rnn` patch,
`tfdet.enable()` with the model's `jit_compile=True` (XLA under
`--xla_gpu_deterministic_ops`, where Keras would turn it off) and
`tfdet.enable(threads=N)` (N = this process's cores), which split tfdet's cost
between cuDNN, XLA and the single host thread. Every round starts
new processes and each reports its weights' digest after the same steps: the
last column says whether a configuration gave the same bits in every round.

`--check` also times `tfdet check --device gpu` (defaults, `builtin:cnn`)
against one plain GPU process training the same steps
(`check_wall_time.py`).

Runs on the GPU machine; anywhere else the same table is measured on the CPU
and says so in its heading.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import check_wall_time  # noqa: E402
import cost_of_determinism  # noqa: E402  (puts the repository on sys.path)

from tfdet._cost import _measure  # noqa: E402
from tfdet._pin import _isa  # noqa: E402

MODELS = str(HERE / "gpu_models.py")
TARGETS = {
    "conv": f"{MODELS}:conv",
    "rnn": f"{MODELS}:rnn",
    "attention": f"{MODELS}:attention",
    "builtin:cnn": "builtin:cnn",
}
TF_DEFAULTS = "TF defaults"
OP_DETERMINISM = "op determinism"
TFDET = "tfdet.enable()"


def device_name() -> str:
    """The GPU's name from nvidia-smi, else the CPU the steps ran on."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        listing = ""
    if listing:
        return f"GPU: {listing.splitlines()[0]}"
    return f"no GPU: CPU, {cost_of_determinism.cores()} cores ({_isa.cpu_model()})"


def configurations(explain: bool) -> dict[str, dict | str | None]:
    """Name -> what the child does (see `cost_of_determinism.measure`)."""
    configs: dict[str, dict | str | None] = {
        TF_DEFAULTS: None,
        OP_DETERMINISM: "op_determinism_only",
        TFDET: {},
    }
    if explain:
        cores = cost_of_determinism.cores()
        configs["tfdet.enable(), cudnn_rnn patch"] = {"patches": ["auto", "cudnn_rnn"]}
        configs["tfdet.enable(), jit_compile=True"] = {"jit_compile": True}
        configs[f"tfdet.enable(threads={cores})"] = {"threads": cores}
    return configs


def ratio_to(figures: dict, name: str, baseline: str) -> float:
    """Median over blocks of `name`'s step time over `baseline`'s."""
    return _measure.block_figures(figures["per_block_ms"], name, baseline).ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"Comma-separated, from {', '.join(TARGETS)}.",
    )
    cost_of_determinism.add_schedule_arguments(
        parser, rounds=3, blocks=4, steps=10, batch_size=32
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="Also time tfdet with the cudnn_rnn patch, with XLA, with N threads.",
    )
    parser.add_argument(
        "--check", action="store_true", help="Also time `tfdet check --device gpu`."
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the figures.")
    args = parser.parse_args(argv)
    targets = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        parser.error(f"unknown --targets {unknown}; known: {', '.join(TARGETS)}")
    cost_of_determinism.check_schedule_arguments(parser, args)
    device = device_name()
    results = {"device": device, "models": {}}
    for name in targets:
        figures = cost_of_determinism.measure(
            args.rounds,
            args.blocks,
            args.steps,
            args.warmup,
            args.batch_size,
            target=TARGETS[name],
            configs=configurations(args.explain),
        )
        figures["tfdet_over_op_determinism"] = ratio_to(figures, TFDET, OP_DETERMINISM)
        results["models"][name] = figures
        print()
        print(cost_of_determinism.format_table(figures, device))
        print(
            f"tfdet.enable() / op determinism: "
            f"{figures['tfdet_over_op_determinism']:.2f}x"
        )
        if args.json:  # After each model: a run cut short keeps what it took.
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.check:
        gpu = device.startswith("GPU")
        results["check"] = check_wall_time.measure(
            args.rounds, device="gpu" if gpu else "cpu"
        )
        print()
        print(check_wall_time.format_report(results["check"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
