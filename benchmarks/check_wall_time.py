"""Wall time of `tfdet check` against one plain training process.

The floor for `check` is one process: its runs go concurrently. Four
commands are measured side by side, alternating, in one run of this script,
and reported as ratios of medians:

- one plain process: `builtin:cnn`, 3 `train_on_batch` steps, Keras seeds
  only (what a user would run without tfdet);
- `tfdet check` with its defaults (2 runs, every perturbation that applies);
- `tfdet check --perturb none`: the same two runs, unperturbed;
- `tfdet check --no-enable`: without tfdet the runs usually diverge, so this
  is a check that also re-runs to attribute the divergence.

    python benchmarks/check_wall_time.py [--rounds 3] [--device cpu|gpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

# The same training as `tfdet check`'s default: builtin:cnn, 3 train_on_batch
# steps.
PLAIN = """
import keras
from tfdet._target import _load
keras.utils.set_random_seed(0)
built = _load.build("builtin:cnn")
for step in range(3):
    built.model.train_on_batch(*built.batch(step))
"""


def commands(device: str) -> dict[str, list[str]]:
    """Name -> argument vector of each command measured, on `device`."""
    check = [sys.executable, "-m", "tfdet", "check", "--device", device]
    return {
        "one plain process": [sys.executable, "-c", PLAIN],
        "tfdet check": check,
        "tfdet check --perturb none": [*check, "--perturb", "none"],
        "tfdet check --no-enable": [*check, "--no-enable"],
    }


def _timed(command: list[str], device: str) -> tuple[float, int]:
    """Seconds the command took, and its exit status."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    started = time.perf_counter()
    process = subprocess.run(command, env=env, capture_output=True, check=False)
    # check exits 0 (identical) or 1 (diverged); anything else is a failure.
    if process.returncode not in (0, 1):
        raise RuntimeError(
            f"{' '.join(command[:4])} exited {process.returncode}:\n"
            f"{process.stderr.decode(errors='replace')[-3000:]}"
        )
    return time.perf_counter() - started, process.returncode


def measure(rounds: int, device: str = "cpu") -> dict:
    """Each command `rounds` times, alternating; medians and exit statuses."""
    measured = commands(device)
    seconds: dict[str, list[float]] = {name: [] for name in measured}
    statuses: dict[str, list[int]] = {name: [] for name in measured}
    for _ in range(rounds):
        for name, command in measured.items():
            elapsed, status = _timed(command, device)
            seconds[name].append(elapsed)
            statuses[name].append(status)
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    plain = medians["one plain process"]
    return {
        "device": device,
        "cores": len(os.sched_getaffinity(0)),
        "rounds": rounds,
        "seconds": seconds,
        "exit_statuses": statuses,
        "median_seconds": medians,
        "ratio_to_plain": {name: value / plain for name, value in medians.items()},
    }


def format_report(figures: dict) -> str:
    """One line per command: median seconds, ratio, exit statuses."""
    lines = [
        f"builtin:cnn on {figures['device']}, {figures['cores']} cores, "
        f"{figures['rounds']} rounds"
    ]
    for name, median in figures["median_seconds"].items():
        statuses = ",".join(str(s) for s in figures["exit_statuses"][name])
        lines.append(
            f"{name:<26} median {median:7.2f} s  "
            f"{figures['ratio_to_plain'][name]:5.2f}x  exit {statuses}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    print(format_report(measure(args.rounds, args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
