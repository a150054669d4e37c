"""Whether each reference model's weights follow the thread-pool size.

Usage:
    python benchmarks/pool_size_models.py [--threads 1,2,3,4,6,8]
        [--patches auto,pool_size_free_products] [--models NAME,...]
        [--json FILE]

Trains `portability.py`'s reference set (the built-ins and the op survey)
and `split_models.py:stride_two_cnn` as the portability record does (tfdet
check's worker, seed 7, 4 steps, a fresh process per model), once per pool
size N with `threads=N` and `patches` in the profile, and prints per model
the groups of N whose weight digests agree: one group is a model whose bits
do not follow the pool size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import portability

STRIDE_TWO = f"{Path(__file__).resolve().parent / 'split_models.py'}:stride_two_cnn"


def groups(digests: dict[int, str]) -> str:
    """`1,2,4 / 3 / 8`: the pool sizes that share a digest, per digest."""
    by_digest: dict[str, list[int]] = {}
    for threads, digest in digests.items():
        by_digest.setdefault(digest, []).append(threads)
    return " / ".join(",".join(map(str, sizes)) for sizes in by_digest.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2,3,4,6,8")
    parser.add_argument("--patches", default="auto,pool_size_free_products")
    parser.add_argument("--models", help="comma-separated (default: all)")
    parser.add_argument("--json", help="also write the digests to this file")
    args = parser.parse_args()
    names = (
        portability.expand(args.models.split(","))
        if args.models
        else [*portability.models(), STRIDE_TWO]
    )
    pools = [int(n) for n in args.threads.split(",")]
    patches = tuple(args.patches.split(","))
    digests: dict[str, dict[int, str]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name in names:
            digests[name] = {
                threads: portability.train(
                    name, f"{workdir}/{threads}", threads=threads, patches=patches
                )["digest"]
                for threads in pools
            }
            label = name if name == STRIDE_TWO else portability.label(name)
            print(f"{label:60s} {groups(digests[name])}", flush=True)
    apart = [name for name, found in digests.items() if len(set(found.values())) > 1]
    print(
        f"{len(names) - len(apart)} of {len(names)} models: one digest for pools "
        f"{args.threads} (patches {args.patches})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(digests, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
