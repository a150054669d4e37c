"""What a run's own directory costs: an overlay each against a copy each.

`tfdet check --script` keeps each run from the user's files by mounting an
overlay of the working directory in a namespace of the run's own, or, where
Linux refuses one, by a mirror that copies small files and links the rest
(`tfdet._runner._isolation`). This times both on two trees made here, side
by side, and weighs their disk:

- `files`: 100,000 files of 1 KiB in 100 directories (a data set of small
  files, or a checkout with its data);
- `large`: ten files of 1 GiB (10 GiB of weights and shards), written.

For each tree and each way, per run: the set-up (overlay: the trial mount
and the walk for links out of the tree, once per check, then one mount per
run, timed as a process that mounts and exits; copies: `_workdir.mirror`),
the disk the run's directory takes before the script writes, and the cost
of rewriting 4 KiB in place of one existing file (overlayfs copies the
whole file up on its first write; the mirror links a large file, so the
write reaches the user's file, which the check then reports).

    python benchmarks/run_isolation.py [--root DIR] [--rounds 3] [--skip-large]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tfdet._runner import _isolation, _workdir

KIB, GIB = 1 << 10, 1 << 30


def _make_files(root: str) -> str:
    tree = os.path.join(root, "files", "project")
    if os.path.isdir(tree):
        return tree
    payload = os.urandom(KIB)
    for d in range(100):
        directory = os.path.join(tree, f"d{d:03d}")
        os.makedirs(directory)
        for f in range(1000):
            with open(os.path.join(directory, f"{f}.bin"), "wb") as out:
                out.write(payload)
    return tree


def _make_large(root: str) -> str:
    tree = os.path.join(root, "large", "project")
    if os.path.isdir(tree):
        return tree
    os.makedirs(tree)
    # Written, not fallocated: overlayfs copies up only what SEEK_DATA
    # finds, and ext4 reports an allocated but unwritten extent as a hole.
    block = os.urandom(1 << 20)
    for k in range(10):
        with open(os.path.join(tree, f"shard{k}.bin"), "wb") as out:
            for _ in range(GIB // len(block)):
                out.write(block)
    return tree


def _disk_bytes(path: str) -> int:
    """Blocks allocated under `path` (not following links), in bytes."""
    total = 0
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def _first_file(tree: str) -> str:
    for directory, dirs, files in os.walk(tree):
        dirs.sort()
        if files:
            return os.path.relpath(os.path.join(directory, sorted(files)[0]), tree)
    raise ValueError(f"no file under {tree}")


_REWRITE = (
    "import sys, time\n"
    "start = time.perf_counter()\n"
    "with open(sys.argv[1], 'r+b') as f: f.write(b'r' * 4096)\n"
    "print(time.perf_counter() - start)\n"
)


def _overlay(tree: str, runs: str) -> dict[str, float]:
    start = time.perf_counter()
    isolation = _isolation.choose(tree, runs)
    chosen = time.perf_counter() - start
    if isolation.kind != _isolation.OVERLAY:
        return {"unavailable": isolation.reason}
    prefix = _isolation._config(isolation.layers, os.path.join(runs, "run0.overlay"))
    launcher = [sys.executable, "-I", "-S", _isolation._LAUNCHER, prefix]
    start = time.perf_counter()
    subprocess.run([*launcher, "/bin/true"], cwd=tree, check=True)
    mounted = time.perf_counter() - start
    disk = _disk_bytes(os.path.join(runs, "run0.overlay"))
    rewrite = subprocess.run(
        [*launcher, sys.executable, "-c", _REWRITE, _first_file(tree)],
        cwd=tree, check=True, capture_output=True, text=True,
    )  # fmt: skip
    written = _disk_bytes(os.path.join(runs, "run0.overlay"))
    return {
        "choose_s": chosen,
        "mount_and_start_s": mounted,
        "disk_before_writes_bytes": disk,
        "rewrite_4k_s": float(rewrite.stdout),
        "disk_after_rewrite_bytes": written,
    }


def _copies(tree: str, runs: str) -> dict[str, float]:
    start = time.perf_counter()
    mirror = _workdir.mirror(tree, os.path.join(runs, "run0-parent", "project"), runs)
    made = time.perf_counter() - start
    return {
        "mirror_s": made,
        "disk_bytes": _disk_bytes(os.path.join(runs, "run0-parent")),
        "files_linked": len(mirror.linked),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="Where the trees are made.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="tfdet-isolation-")
    trees = {"files": _make_files(root)}
    if not args.skip_large:
        trees["large"] = _make_large(root)
    results: dict[str, dict[str, list]] = {}
    for round_ in range(args.rounds):
        for name, tree in trees.items():
            for way, measure in (("overlay", _overlay), ("copies", _copies)):
                runs = tempfile.mkdtemp(prefix="tfdet-isolation-runs-")
                try:
                    found = measure(tree, runs)
                finally:
                    shutil.rmtree(runs, ignore_errors=True)
                for key, value in found.items():
                    results.setdefault(f"{name}/{way}", {}).setdefault(key, []).append(
                        value
                    )
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    summary = {
        case: {
            key: statistics.median(values)
            if all(isinstance(v, int | float) for v in values)
            else values[0]
            for key, values in figures.items()
        }
        for case, figures in results.items()
    }
    print(
        json.dumps({"root": root, "rounds": args.rounds, "median": summary}, indent=2)
    )


if __name__ == "__main__":
    main()
