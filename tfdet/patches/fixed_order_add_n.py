"""`AddN` of three or more tensors summed in the order of its inputs.

TensorFlow's `AddN` kernel (the CPU's; the GPU's is the same code, not
measured there) writes its sum into one of its input buffers when it may
(the first input, in order, that no other op still holds), and then moves
that input to the front of the sum: `AddN(a, b, c)` is `(a + b) + c` when
it reuses `a`'s buffer or none, but `(c + b) + a` when it reuses `c`'s.
So its bits follow whether the ops that also read `c` have finished, which
is the executor's schedule, not the graph. With one inter-op thread the
schedule repeats from process to process; with more, ops run side by side
and it does not: keras.applications.MobileNetV2's gradients of one batch
gave 2-3 digests in 12 calls under op determinism, oneDNN on or off,
intra-op pool 2, inter-op pool 2, each BatchNormalization's input gradient
being an `AddN` of three (docs/measurements.md, "The inter-op pool"). Two
inputs are safe: `a + b` is `b + a` exactly.

This patch replaces `gen_math_ops.add_n` (every binding: `tf.math.add_n`
and the gradient tape's aggregation of a tensor's gradients call it) with
`AddV2`s folded left, `((a + b) + c) + ...`: the sum `AddN` computes when
it reuses no buffer, whatever the schedule. An `AddV2` may still reuse a
buffer, but of two inputs only. Grappler's arithmetic optimizer would fold
the chain back into one `AddN`, so the patch turns it off (as
`portable_sqrt_division` does). Non-float inputs (TensorList variants,
integers) and `IndexedSlices` keep the original op.

Installed by "auto": with it the inter-op pool has `threads` threads (one
without it, where the sum repeats only because the schedule does), so that
independent ops (a bidirectional layer's two directions) run side by side.
Against one inter-op thread without the patch, it changes the bits of
models whose `AddN` reused a later input's buffer.
`benchmarks/inter_op_pool.py` measures the bits with both pools, with and
without the patch.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap
from tfdet.patches import portable_sqrt_division

_ADD_N = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "add_n")


def add_n(inputs: Any, name: str | None = None) -> Any:
    """The sum of `inputs` as `((inputs[0] + inputs[1]) + inputs[2]) + ...`.

    Example:

    >>> import tensorflow as tf
    >>> a, b, c = (tf.constant([value]) for value in (1.0, 1e8, -1e8))
    >>> add_n([a, b, c]).numpy().tolist()  # (1 + 1e8) rounds to 1e8
    [0.0]

    Args:
        inputs: A list of tensors of one shape and dtype; float ones of three
            or more are folded here, anything else goes to the original op.
        name: Name scope.
    """
    import tensorflow as tf
    from tensorflow.python.ops import gen_math_ops

    values = list(inputs) if isinstance(inputs, (list, tuple)) else []
    if (
        len(values) < 3
        or not all(isinstance(value, tf.Tensor) for value in values)
        or values[0].dtype.name not in _exact_math.FLOATS
    ):
        return _ADD_N.original(inputs, name=name)
    with tf.name_scope(name or "DeterministicAddN"):
        return functools.reduce(gen_math_ops.add_v2, values)


def _apply(swap: Swap) -> None:
    swap.attribute(portable_sqrt_division.ARITHMETIC_OPTIMIZER, "enabled", False)
    _ADD_N.replace(swap, add_n)


PATCH = Patch(
    replaces=("AddN",),
    summary="AddN of 3+ tensors (sums from the input whose buffer it reuses: "
    "the schedule's choice) -> AddV2s folded in input order",
    upstream="https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/kernels/aggregate_ops.h",
    apply=_apply,
)
