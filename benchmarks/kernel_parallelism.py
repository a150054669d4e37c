"""How parallel tfdet's fixed-order kernels are on the zoo, from the shapes.

Each fixed-order kernel (`tfdet/_kernels/src/fixed_order/`) splits its work
into tasks that TensorFlow's intra-op pool shares: a product or convolution
into output tiles, times K blocks where its sum is long (`Plan`, `Tiling`,
`KBlocks` in `core.h`), a depthwise filter gradient into (filter row, 16
channels) tasks (`depthwise.h`). The split follows the shapes, the pool
size and the vector path alone (only the K blocks decide bits), so it is
had without running a product: for every kernel call of a zoo model's
training step (its `tf.function` traced under `tfdet.enable()`, recurrent
layers' loop bodies included), the kernel's own `TfdetFixedOrderPlan` op
says the threads it uses at a pool of 2, 16 and 64 (one per 2^23
multiply-adds at most: `ThreadsFor`) and its number of tasks; the ideal
speedup over one thread is tasks / ceil(tasks / threads). The depthwise
split is computed here from the header's constants.

    python benchmarks/kernel_parallelism.py [--models resnet50,encoder]
        [--pools 2,16,64] [--json FILE]

Exit 1 when a call's tasks leave more than a quarter of the threads it may
use idle at the largest pool (`SHORT_OF_TASKS`: the bound the kernels are
held to; `tests/test_fixed_order_kernels.py` holds the recorded zoo's calls
to it). What it does not see: the sums and element-wise ops (other
kernels, split by element), how long each task runs, and how often a loop
body runs (once per time step).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

HEADERS = REPO / "tfdet" / "_kernels" / "src" / "fixed_order"
MODELS = ("builtin:cnn", "resnet50", "mobilenet_v2", "encoder", "lstm_text")
POOLS = (2, 16, 64)
# A call whose tasks leave more than a quarter of the threads it may use
# idle (the bound the kernels are held to) is listed.
SHORT_OF_TASKS = 0.75


def _constant(header: str, name: str) -> int:
    """`constexpr int64 NAME = VALUE;` from a kernel header (a number, or
    `int64{1} << N`)."""
    text = (HEADERS / header).read_text(encoding="utf-8")
    found = re.search(rf"constexpr int64 {name} =\s*([^;]+);", text)
    if found is None:
        raise ValueError(f"Expected {name} in {header}.")
    shift = re.fullmatch(r"int64\{1\}\s*<<\s*(\d+)", found.group(1).strip())
    return 1 << int(shift.group(1)) if shift else int(found.group(1))


MIN_WORK_PER_THREAD = _constant("core.h", "kMinWorkPerThread")
DEPTHWISE_LANES = _constant("depthwise.h", "kDepthwiseLanes")
NR = _constant("core.h", "kNR")


def threads_for(work: int, pool: int) -> int:
    """`ThreadsFor`: the pool's threads, one per MIN_WORK_PER_THREAD at most
    (for the depthwise kernel, which the plan op does not describe)."""
    return max(1, min(pool, work // MIN_WORK_PER_THREAD))


def speedup(tasks: int, threads: int) -> float:
    """The ideal speedup of `tasks` equal tasks over `threads` threads."""
    used = min(threads, tasks)
    return round(tasks / math.ceil(tasks / used), 2)


def short_of_tasks(plan: dict[str, Any]) -> bool:
    """Whether a call's tasks leave more than a quarter of its threads idle."""
    return plan["speedup"] < SHORT_OF_TASKS * plan["threads"]


@dataclass(frozen=True)
class Call:
    """One kernel call's work: `batch` products of (m x k) @ (k x n), or a
    depthwise filter gradient (`depthwise` its (filter_h, filter_w,
    channels, terms))."""

    op: str
    batch: int
    m: int
    n: int
    k: int
    depthwise: tuple[int, int, int, int] | None = None

    @property
    def work(self) -> int:
        """Multiply-adds."""
        if self.depthwise is not None:
            return math.prod(self.depthwise)
        return self.batch * self.m * self.n * self.k

    def plan(self, pool: int) -> dict[str, Any]:
        """Threads used, tasks, and the ideal speedup at a pool of `pool`."""
        if self.depthwise is not None:
            # Tasks of one filter row and 16 channels (3 rows a task on the
            # AVX-512 path where the channel blocks alone fill the threads).
            threads = threads_for(self.work, pool)
            filter_h, _, channels, _ = self.depthwise
            tasks = filter_h * -(-channels // DEPTHWISE_LANES)
        else:
            from tfdet._kernels import fixed_order

            split = fixed_order.plan(self.batch, self.m, self.n, self.k, pool)
            threads, tasks = split["threads"], split["tasks"]
        return {"threads": threads, "tasks": tasks, "speedup": speedup(tasks, threads)}

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Call:
        """The call a row of the table (its JSON) describes."""
        if row["op"].startswith("Depthwise"):
            return cls(row["op"], 1, 0, 0, 0, tuple(row["shape"]))
        return cls(row["op"], *row["shape"])


def call_of(op: Any) -> Call | None:
    """The work of a traced fixed-order op (None for other ops, or where a
    shape is not known when traced)."""
    shapes = [tensor.shape for tensor in op.inputs]
    out = op.outputs[0].shape if op.outputs else None
    if not all(s.is_fully_defined() for s in shapes) or out is None:
        return None
    if not out.is_fully_defined():
        return None
    dims = [s.as_list() for s in shapes]
    kind = op.type.removeprefix("TfdetFixedOrder")
    if kind == "MatMul":
        a = dims[0]
        m, k = (a[1], a[0]) if op.get_attr("transpose_a") else (a[0], a[1])
        return Call(kind, 1, m, out[1], k)
    if kind == "BatchMatMul":
        a = dims[0]
        k = a[-2] if op.get_attr("adj_x") else a[-1]
        return Call(kind, math.prod(out[:-2]), out[-2], out[-1], k)
    if kind == "Conv2D":
        filter_h, filter_w, channels, filters = dims[1]
        return Call(kind, 1, out[0] * out[1] * out[2], filters,
                    filter_h * filter_w * channels)  # fmt: skip
    if kind == "Conv2DBackpropInput":
        filter_h, filter_w, channels, filters = dims[1]
        return Call(kind, 1, out[0] * out[1] * out[2], channels,
                    filter_h * filter_w * filters)  # fmt: skip
    if kind == "Conv2DBackpropFilter":
        filter_h, filter_w, channels, filters = out
        gradient = dims[2]
        positions = gradient[0] * gradient[1] * gradient[2]
        weights = filter_h * filter_w * channels
        if filters >= 2 * NR:  # The filter's own layout.
            return Call(kind, 1, weights, filters, positions)
        return Call(kind, 1, filters, weights, positions)
    if kind == "DepthwiseConv2dNativeBackpropFilter":
        filter_h, filter_w, channels, _ = out
        gradient = dims[2]
        terms = gradient[0] * gradient[1] * gradient[2]
        return Call(kind, 1, 0, 0, 0, (filter_h, filter_w, channels, terms))
    return None


def _graphs(graph: Any, seen: set[str]) -> Any:
    """`graph` and every function graph it calls (loop bodies, gradients):
    through `FuncGraph._functions`, TensorFlow's own (private) map of the
    functions a graph holds, which no public API lists with their graphs."""
    yield graph
    for name, function in getattr(graph, "_functions", {}).items():
        inner = getattr(function, "graph", None)
        if inner is not None and name not in seen:
            seen.add(name)
            yield from _graphs(inner, seen)


def calls(name: str) -> collections.Counter[Call]:
    """The fixed-order kernel calls of one training step of model `name`
    (a loop body's once), counted."""
    import tensorflow as tf
    import zoo

    model, x, y = zoo.load(name)
    model.train_on_batch(x[:32], y[:32])  # Builds the optimizer's variables.
    step = tf.function(model.train_step)
    data = (tf.constant(x[:32]), tf.constant(y[:32]))
    graph = step.get_concrete_function(data).graph
    found: collections.Counter[Call] = collections.Counter()
    for inner in _graphs(graph, set()):
        for op in inner.get_operations():
            if op.type.startswith("TfdetFixedOrder"):
                call = call_of(op)
                if call is not None:
                    found[call] += 1
    return found


def table(names: list[str], pools: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per distinct kernel call of each model."""
    rows = []
    for name in names:
        for call, count in sorted(calls(name).items(), key=lambda i: -i[0].work):
            rows.append({
                "model": name, "op": call.op, "count": count,
                "shape": list(call.depthwise) if call.depthwise
                else [call.batch, call.m, call.n, call.k],
                "mflop": round(2 * call.work / 1e6, 1),
                **{f"pool {pool}": call.plan(pool) for pool in pools},
            })  # fmt: skip
    return rows


def summary(
    rows: list[dict[str, Any]], pools: tuple[int, ...]
) -> dict[str, dict[int, float]]:
    """Each model's ideal speedup of all its kernel work at each pool: the
    work over the work divided by each call's own speedup (a loop body's
    calls counted once)."""
    found: dict[str, dict[int, float]] = {}
    for name in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == name]
        work = sum(row["mflop"] * row["count"] for row in mine)
        found[name] = {
            pool: round(
                work
                / sum(
                    row["mflop"] * row["count"] / row[f"pool {pool}"]["speedup"]
                    for row in mine
                ),
                2,
            )
            for pool in pools
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--pools", default=",".join(map(str, POOLS)))
    parser.add_argument("--json", metavar="FILE", help="Also write the rows.")
    args = parser.parse_args(argv)
    pools = tuple(int(pool) for pool in args.pools.split(","))
    import tfdet

    tfdet.enable(seed=0)
    rows = table(args.models.split(","), pools)
    header = " | ".join(f"pool {p}: threads, tasks, speedup" for p in pools)
    print(f"| model | op | calls | shape | MFLOP | {header} |")
    print("|---" * (5 + len(pools)) + "|")
    for row in rows:
        plans = " | ".join(
            "{threads}, {tasks}, {speedup}x".format(**row[f"pool {p}"]) for p in pools
        )
        print(
            f"| {row['model']} | {row['op']} | {row['count']} | "
            f"{'x'.join(map(str, row['shape']))} | {row['mflop']} | {plans} |"
        )
    print()
    for name, speedups in summary(rows, pools).items():
        ideal = ", ".join(f"{speedups[p]}x at {p}" for p in pools)
        print(f"{name}: the kernels' work, ideal speedup {ideal}")
    short = [row for row in rows if short_of_tasks(row[f"pool {pools[-1]}"])]
    for row in short:
        plan = row[f"pool {pools[-1]}"]
        print(
            f"  short of tasks at {pools[-1]}: {row['model']} {row['op']} "
            f"{'x'.join(map(str, row['shape']))}: {plan['tasks']} tasks "
            f"for {plan['threads']} threads"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
