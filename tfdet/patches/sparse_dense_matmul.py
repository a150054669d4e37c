"""Deterministic sparse x dense matmul (`SparseTensorDenseMatMul`).

TensorFlow's GPU kernel for `SparseTensorDenseMatMul` accumulates with
atomics and raises `UnimplementedError` under op determinism (the op list of
the determinism RFC, tensorflow/community#346). `tf.sparse.sparse_dense_matmul`
(and Keras layers fed `tf.SparseTensor` inputs) reach it in the forward pass,
and its registered gradient calls it again for the dense operand. This patch
replaces the generated op wrapper `gen_sparse_ops.sparse_tensor_dense_mat_mul`,
which both go through, with a gather of the dense rows, a multiply by the
sparse values and an `UnsortedSegmentSum` over the output rows (sort-based
and deterministic on GPU). Its gradients follow from those ops (gather's
gradient is again a segment sum), so no refused op remains.

Out-of-range indices and mismatched inner dimensions raise
`InvalidArgumentError`, as the CPU kernel does; the index check is an
`Assert` whose one boolean goes to the host.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap


def _adjoint(matrix: Any) -> Any:
    import tensorflow as tf

    return (
        tf.linalg.adjoint(matrix) if matrix.dtype.is_complex else tf.transpose(matrix)
    )


def _gather_rows(params: Any, indices: Any) -> Any:
    """`tf.gather(params, indices)` whose gradient is dense, like the original's.

    `tf.gather`'s own gradient is an `IndexedSlices`; as the gradient of a
    dense operand it would send tf_keras optimizers to their host-side
    scatter updates. The dense gradient is a segment sum (deterministic).
    """
    import tensorflow as tf

    @tf.custom_gradient
    def gather(params: Any) -> Any:
        def grad(upstream: Any) -> Any:
            return tf.math.unsorted_segment_sum(upstream, indices, tf.shape(params)[0])

        return tf.gather(params, indices), grad

    return gather(params)


def sparse_tensor_dense_mat_mul(
    a_indices: Any,
    a_values: Any,
    a_shape: Any,
    b: Any,
    adjoint_a: bool = False,
    adjoint_b: bool = False,
    name: str | None = None,
) -> Any:
    """Deterministic `tf.raw_ops.SparseTensorDenseMatMul`.

    Example:

    >>> import tensorflow as tf
    >>> out = sparse_tensor_dense_mat_mul([[0, 1], [1, 0]], [2.0, 3.0], [2, 2], tf.eye(2))
    >>> out.numpy().tolist()
    [[0.0, 2.0], [3.0, 0.0]]

    Args:
        a_indices: `[nnz, 2]` int64 indices of the sparse matrix A.
        a_values: `[nnz]` values of A.
        a_shape: `[2]` dense shape of A.
        b: Dense matrix B.
        adjoint_a: Use A's (conjugate) transpose.
        adjoint_b: Use B's (conjugate) transpose.
        name: Name scope.

    Returns:
        The dense product, of B's dtype.
    """
    import tensorflow as tf

    with tf.name_scope(name or "DeterministicSparseTensorDenseMatMul"):
        indices = tf.convert_to_tensor(a_indices, dtype=tf.int64)
        values = tf.convert_to_tensor(a_values)
        shape = tf.convert_to_tensor(a_shape, dtype=tf.int64)
        b = tf.convert_to_tensor(b, dtype=values.dtype)
        rows, cols = indices[:, 0], indices[:, 1]
        out_rows, inner = shape[0], shape[1]
        if adjoint_a:
            rows, cols, out_rows, inner = cols, rows, inner, out_rows
            if values.dtype.is_complex:
                values = tf.math.conj(values)
        if adjoint_b:
            b = _adjoint(b)
        b_rows = tf.shape(b, out_type=tf.int64)[0]
        checks = [
            tf.debugging.assert_equal(
                inner,
                b_rows,
                message="Cannot multiply A and B because inner dimension does not match",
            ),
            tf.debugging.Assert(
                tf.reduce_all(
                    (rows >= 0) & (rows < out_rows) & (cols >= 0) & (cols < b_rows)
                ),
                ["sparse indices out of bounds of the dense shape", shape],
            ),
        ]
        with tf.control_dependencies(checks):
            rows = tf.identity(rows)
        # Same products, added to each output row in the order of the
        # sparse entries, as the CPU kernel does.
        parts = values[:, None] * _gather_rows(b, cols)
        return tf.math.unsorted_segment_sum(parts, rows, out_rows)


def _apply(swap: Swap) -> None:
    from tensorflow.python.ops import gen_sparse_ops

    swap.attribute(
        gen_sparse_ops, "sparse_tensor_dense_mat_mul", sparse_tensor_dense_mat_mul
    )


PATCH = Patch(
    replaces=("SparseTensorDenseMatMul",),
    summary="SparseTensorDenseMatMul -> Gather, Mul, UnsortedSegmentSum",
    upstream="https://github.com/tensorflow/community/pull/346",
    apply=_apply,
)
