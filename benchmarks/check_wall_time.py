"""Wall time of `tfdet check` (defaults) against one plain training process.

The floor for `check` is one process: its runs go concurrently. Both are
measured side by side, alternating, in one run of this script, and reported
as the ratio of medians.

    python benchmarks/check_wall_time.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

# The same training as `tfdet check`'s default: builtin:cnn, 3 train_on_batch
# steps, Keras seeds only (what a user would run without tfdet).
PLAIN = """
import keras
from tfdet._runs import _target
keras.utils.set_random_seed(0)
built = _target.build("builtin:cnn")
for step in range(3):
    built.model.train_on_batch(*built.batch(step))
"""


def _timed(command: list[str]) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plain, check, unperturbed = [], [], []
    for _ in range(args.rounds):
        plain.append(_timed([sys.executable, "-c", PLAIN]))
        check.append(_timed([sys.executable, "-m", "tfdet", "check"]))
        unperturbed.append(
            _timed([sys.executable, "-m", "tfdet", "check", "--perturb", "none"])
        )
    p, c, u = (statistics.median(t) for t in (plain, check, unperturbed))
    print(f"cores available: {len(os.sched_getaffinity(0))}, rounds: {args.rounds}")
    print(f"one plain process (3 steps of builtin:cnn):  median {p:.2f} s")
    print(f"tfdet check (2 runs, all perturbations):    median {c:.2f} s")
    print(f"tfdet check --perturb none (2 runs):        median {u:.2f} s")
    print(f"ratio check / plain: {c / p:.2f}x (--perturb none: {u / p:.2f}x)")


if __name__ == "__main__":
    main()
