"""Time per TensorFlow op type, read from the profiler's trace of a few steps.

`tf.profiler.experimental` writes an XSpace protobuf (`*.xplane.pb`): one
plane per device, one line per thread, one event per executed op named
`node:OpType` (with oneDNN, `_MklNativeConv2DBackpropFilter`: reported as
`Conv2DBackpropFilter`). Function calls and control flow are left out: their
events enclose the ops inside them, which are counted themselves. The ops
inside one of tfdet's replacements (a node under a `PoolSizeFree...`,
`Deterministic...` or `Portable...` name scope) count as that replacement:
it is what stands in for the op it replaced. TensorFlow makes each use of a
name scope unique with a suffix (`PoolSizeFreeConv2D`, `PoolSizeFreeConv2D_1`,
`PoolSizeFreeConv2D_21`): they are one op type, named without it.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
from typing import Any

from tfdet._patching._registry import SCOPE_PREFIXES

# An op's event: `node:OpType`. API and runtime events ("EagerExecute",
# "EagerLocalExecute: __inference_...") have no such name.
_OP_EVENT = re.compile(r"^(?P<node>[^\s:]+):(?P<type>_?[A-Z][A-Za-z0-9_]*)$")
# oneDNN's kernels, named after the TensorFlow op they stand in for.
_KERNEL_PREFIXES = ("_MklNative", "_Mkl", "_")
# The suffix TensorFlow adds to a name scope used again in one graph.
_UNIQUE_SUFFIX = re.compile(r"_[0-9]+$")
# Events that enclose other ops' events.
_ENCLOSING = frozenset(
    {"PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile"}
    | {"If", "StatelessIf", "Case", "StatelessCase"}
)


class Profiling:
    """One session of TensorFlow's profiler: `start()`, train, `stop(steps)`.

    Started and stopped in separate calls, as a paused script needs.
    """

    def __init__(self) -> None:
        self._logdir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        import tensorflow as tf

        self._logdir = tempfile.TemporaryDirectory(prefix="tfdet-cost-profile-")
        tf.profiler.experimental.start(self._logdir.name)

    def stop(self, steps: int) -> dict[str, dict[str, Any]]:
        """Ends the session: `per_op_type` of the `steps` steps trained in it."""
        import tensorflow as tf

        tf.profiler.experimental.stop()
        if self._logdir is None:
            raise RuntimeError("Expected Profiling.start() before stop().")
        with self._logdir as logdir:
            return per_op_type(logdir, max(1, steps))


def op_type(kernel: str) -> str:
    """The TensorFlow op type of a kernel's name (`_MklNativeFusedConv2D` ->
    `FusedConv2D`)."""
    for prefix in _KERNEL_PREFIXES:
        if kernel.startswith(prefix) and len(kernel) > len(prefix):
            return kernel[len(prefix) :]
    return kernel


def _replacement(node: str) -> tuple[str, str] | None:
    """`(replacement, its path)` when `node` runs inside one of tfdet's
    replacements; the replacement is its scope without a unique suffix."""
    parts = node.split("/")
    for index, part in enumerate(parts):
        if part.startswith(SCOPE_PREFIXES):
            return _UNIQUE_SUFFIX.sub("", part), "/".join(parts[: index + 1])
    return None


def per_op_type(logdir: str, steps: int) -> dict[str, dict[str, Any]]:
    """`{op type: {"ms": per step, "node": its costliest node}}`, summed over
    threads, from the profile of `steps` steps written to `logdir`.

    Raises:
        FileNotFoundError: the profiler wrote no trace there.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise FileNotFoundError(
            f"Expected a profiler trace in {logdir}. Received: none"
        )
    totals: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in paths:
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            names = {key: meta.name for key, meta in plane.event_metadata.items()}
            for line in plane.lines:
                for event in line.events:
                    match = _OP_EVENT.match(names.get(event.metadata_id, ""))
                    if match is None:
                        continue
                    kind, node = op_type(match["type"]), match["node"]
                    if kind in _ENCLOSING:
                        continue
                    replacement = _replacement(node)
                    if replacement is not None:
                        kind, node = replacement
                    ms = event.duration_ps / 1e9
                    totals[kind] += ms
                    by_node[kind, node] += ms
    costliest: dict[str, tuple[float, str]] = {}
    for (kind, node), ms in by_node.items():
        if ms > costliest.get(kind, (-1.0, ""))[0]:
            costliest[kind] = (ms, node)
    return {
        kind: {"ms": ms / steps, "node": costliest[kind][1]}
        for kind, ms in totals.most_common()
    }
