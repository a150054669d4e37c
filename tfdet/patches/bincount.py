"""Deterministic bincount (`Bincount`, `DenseBincount`).

TensorFlow has no deterministic GPU kernel for the bincount ops and raises
`UnimplementedError` under op determinism (discussed in
tensorflow/tensorflow#56905). They are reached by `tf.math.bincount`,
`keras.ops.bincount` and `CategoryEncoding(output_mode="count")` in Keras 3
and tf_keras. This patch replaces the generated op wrappers that
`tf.math.bincount` (and every other Python caller) goes through,
`gen_math_ops.dense_bincount` and `gen_math_ops.bincount`, with a count built
from `UnsortedSegmentSum`, which is sort-based and deterministic on GPU.

Values at or above `size` are dropped, as in the original; negative values
and a negative `size` raise `InvalidArgumentError`, as the original CPU kernel
does. That check is an `Assert`, whose one boolean goes to the host; the
original already needs `size` on the host to allocate its output.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def _invalid(message: str) -> Exception:
    import tensorflow as tf

    # Eager kernels report bad inputs as InvalidArgumentError; graph-mode
    # shape inference reports them as ValueError at trace time.
    if tf.executing_eagerly():
        return tf.errors.InvalidArgumentError(None, None, message)
    return ValueError(message)


def dense_bincount(
    input: Any,  # noqa: A002  (the generated op's argument name)
    size: Any,
    weights: Any,
    binary_output: bool = False,
    name: str | None = None,
) -> Any:
    """Deterministic `tf.raw_ops.DenseBincount`.

    Example:

    >>> import tensorflow as tf
    >>> dense_bincount([1, 1, 3], 4, tf.constant([], tf.int32)).numpy().tolist()
    [0, 2, 0, 1]

    Args:
        input: Integer values, rank 1 or 2 (rank 2 counts each row).
        size: Number of bins, a non-negative scalar.
        weights: Same shape as `input`, or empty for counts. The output has
            its dtype.
        binary_output: Whether to output 1 for each non-empty bin.
        name: Name scope.

    Raises:
        InvalidArgumentError: negative values or size, rank above 2, or
            weights of another shape (ValueError when traced in a graph).
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicDenseBincount"):
        values = tf.convert_to_tensor(input)
        size = tf.convert_to_tensor(size, dtype=values.dtype)
        weights = tf.convert_to_tensor(weights)
        rank = values.shape.rank
        if rank is not None and rank > 2:
            raise _invalid(f"Shape must be at most rank 2 but is rank {rank}")
        unweighted = weights.shape.num_elements() == 0
        shapes_known = (
            weights.shape.is_fully_defined() and values.shape.is_fully_defined()
        )
        if not unweighted and shapes_known and weights.shape != values.shape:
            raise _invalid(
                "`weights` must be the same shape as `arr` or a length-0 "
                "`Tensor`, in which case it acts as all weights equal to "
                f"1. Received {weights.shape.as_list()}"
            )
        checks = [
            tf.debugging.assert_non_negative(size, message="size must be non-negative"),
            tf.debugging.assert_non_negative(
                values, message="Input arr must be non-negative!"
            ),
        ]
        with tf.control_dependencies(checks):
            values = tf.identity(values)
        out_dtype = weights.dtype
        if unweighted or binary_output:
            updates = tf.ones_like(values, dtype=out_dtype)
        else:
            updates = weights
        # One extra bin per row collects values >= size, which are dropped.
        bins = size + 1
        kept = tf.where(values < size, values, size)
        if values.shape.rank == 2:
            rows = tf.shape(values, out_type=values.dtype)[0]
            offsets = tf.range(rows, dtype=values.dtype)[:, None] * bins
            counts = tf.math.unsorted_segment_sum(updates, kept + offsets, rows * bins)
            counts = tf.reshape(counts, tf.stack([rows, bins]))[:, :-1]
        else:
            counts = tf.math.unsorted_segment_sum(updates, kept, bins)[:-1]
        if binary_output:
            counts = tf.cast(counts > 0, out_dtype)
        return counts


def bincount(arr: Any, size: Any, weights: Any, name: str | None = None) -> Any:
    """Deterministic `tf.raw_ops.Bincount` (the `tf.compat.v1` op, rank 1)."""
    return dense_bincount(
        arr, size, weights, binary_output=False, name=name or "DeterministicBincount"
    )


def _apply(swap: Swap) -> None:
    from tensorflow.python.ops import gen_math_ops

    swap.attribute(gen_math_ops, "dense_bincount", dense_bincount)
    swap.attribute(gen_math_ops, "bincount", bincount)


PATCH = Patch(
    replaces=("Bincount", "DenseBincount"),
    summary="(Dense)Bincount -> UnsortedSegmentSum",
    upstream="https://github.com/tensorflow/tensorflow/pull/56905",
    apply=_apply,
)
