"""MatMul, BatchMatMul, Einsum and GELU as `pool_size_free_products` computes them.

Each product is a grouped 1x1 convolution (`_geometry.batch_matmul`), whose
sums oneDNN keeps inside one thread whatever the pool size and the batch;
`Einsum` goes through TensorFlow's Python decomposition into those
products; GELU's exact form is written without the division that Grappler
rewrites when traced. The patch module binds these replacements
(`pool_size_free_products._apply`), and `fixed_order_products` calls
`mat_mul` where its kernel did not load; a product's refusals and its
BatchMatMul composition are `_geometry`'s, which that patch shares.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching import _exact_math
from tfdet.patches import _geometry, _whole_packets

MAT_MUL = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "mat_mul")
BATCH_MAT_MUL = {
    version: _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", version)
    for version in ("batch_mat_mul_v2", "batch_mat_mul_v3")
}
EINSUM = _exact_math.GeneratedOp("tensorflow.python.ops.gen_linalg_ops", "einsum")
# Not a generated wrapper, but bound the same ways (`tf.nn.gelu` is it).
GELU = _exact_math.GeneratedOp("tensorflow.python.ops.nn_ops", "gelu")


@_geometry.tensorflows_under_xla(MAT_MUL)
def mat_mul(
    a: Any,
    b: Any,
    transpose_a: bool = False,
    transpose_b: bool = False,
    name: str | None = None,
    **flags: Any,
) -> Any:
    """`tf.raw_ops.MatMul`, bits independent of the pool size for float32."""
    import tensorflow as tf

    a_tensor, b_tensor = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    if _geometry.mat_mul_left_to_tensorflow(a_tensor, b_tensor):
        _whole_packets.left_to_tensorflow("MatMul", a_tensor.dtype)
        return MAT_MUL.original(
            a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name, **flags
        )
    with tf.name_scope(name or "PoolSizeFreeMatMul"):
        if transpose_a:
            a_tensor = tf.transpose(a_tensor)
        if transpose_b:
            b_tensor = tf.transpose(b_tensor)
        # A batch of one: one group, a plain 1x1 convolution.
        return _geometry.batch_matmul(a_tensor[None], b_tensor[None])[0]


def batch_mat_mul_replacement(version: str) -> Any:
    """The replacement of `gen_math_ops.<version>` (BatchMatMulV2 or V3)."""

    @_geometry.tensorflows_under_xla(BATCH_MAT_MUL[version])
    def batch_mat_mul(
        x: Any,
        y: Any,
        *args: Any,
        adj_x: bool = False,
        adj_y: bool = False,
        name: str | None = None,
        **flags: Any,
    ) -> Any:
        import tensorflow as tf

        original = BATCH_MAT_MUL[version].original
        a, b = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        out_type = args[0] if args else flags.get("Tout", tf.float32)
        left, reason = _geometry.batch_mat_mul_left_to_tensorflow(a, b, out_type)
        if left:
            _whole_packets.left_to_tensorflow("BatchMatMul", a.dtype, reason)
            return original(x, y, *args, adj_x=adj_x, adj_y=adj_y, name=name, **flags)
        with tf.name_scope(name or "PoolSizeFreeBatchMatMul"):
            static_batch = tf.broadcast_static_shape(a.shape[:-2], b.shape[:-2])
            product = _geometry.broadcast_batch_matmul(a, b, adj_x, adj_y)
            product.set_shape(static_batch.concatenate(product.shape[-2:]))
            return product

    return batch_mat_mul


@_geometry.tensorflows_under_xla(EINSUM)
def einsum(inputs: Any, equation: str, name: str | None = None) -> Any:
    """`tf.raw_ops.Einsum` as transposes, reshapes and the products above.

    TensorFlow's own Python decomposition (`_einsum_v1`), whose products go
    through `tf.matmul`, hence through this patch's `MatMul` and
    `BatchMatMul`.
    """
    import tensorflow as tf
    from tensorflow.python.ops import special_math_ops

    tensors = [tf.convert_to_tensor(x) for x in inputs]
    if any(t.dtype != tf.float32 for t in tensors):
        _whole_packets.left_to_tensorflow("Einsum", tensors[0].dtype)
        return EINSUM.original(inputs, equation, name=name)
    try:
        return special_math_ops._einsum_v1(equation, *tensors, name=name)
    except ValueError:
        # A subscript the decomposition does not take (a diagonal such as
        # "ii->i"); it raises while building, before any op runs.
        _whole_packets.left_to_tensorflow(
            "Einsum", tensors[0].dtype, f"the equation {equation!r}"
        )
        return EINSUM.original(inputs, equation, name=name)


def gelu(features: Any, approximate: bool = False, name: str | None = None) -> Any:
    """`tf.nn.gelu`, exact form as TensorFlow 2.19+ writes it, by multiplications.

    TensorFlow 2.16-2.18 compute `0.5 * x * (1 + erf(x / sqrt(2)))`; inside a
    `tf.function`, Grappler's constant folding turns the division by a
    constant into a multiplication by its reciprocal, so a traced function
    (`predict`) gives other bits than eager code (`model(x)`). `0.5 * x * erfc(-x *
    0.7071067811865476)` has no division to rewrite, and is TensorFlow
    2.19+'s own expression, so its bits there are unchanged.
    """
    import tensorflow as tf

    x = tf.convert_to_tensor(features)
    if approximate or x.dtype != tf.float32:
        return GELU.original(features, approximate=approximate, name=name)
    with tf.name_scope(name or "PoolSizeFreeGelu"):
        return 0.5 * x * tf.math.erfc(-x * 0.7071067811865476)
