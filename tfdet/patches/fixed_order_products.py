"""Products by tfdet's own kernel, bits fixed by the shapes alone.

`MatMul`, `BatchMatMulV2/V3` and `Einsum` (through TensorFlow's Python
decomposition into transposes, reshapes and those products) of float32
are computed by tfdet's fixed-order product kernel
(`tfdet/_kernels/fixed_order.py`): every output element is one
chain of fused multiply-adds over k in order (a long K in blocks fixed by
its length, added in order), and the work is split over output tiles and
those blocks. So a product's bits follow neither the pool size, nor
the number of rows (a sample's bits do not follow its batch), nor the
vector width (the AVX-512, AVX2 and scalar paths agree); their gradients are the
same kernel. Dense layers and MultiHeadAttention's einsum products reach
it through those ops.

Where `pool_size_free_products` turns each product into a oneDNN 1x1
convolution and about ten ops of plumbing, this is one op per product.
It covers the products only: the other ops that `pool_size_free_products`
replaces (convolutions and their gradients, `BiasAddGrad`, the element-wise
functions on whole packets, tf_keras's fused BatchNormalization) are
TensorFlow's, so a convolutional model still follows the pool size
(`fixed_order_convolutions` computes the convolutions by the same kernel).
Installed together with `pool_size_free_products`
(`patches=["auto", "pool_size_free_products", "fixed_order_products"]`),
the products are this kernel's and that patch computes the rest: a whole
model apart from the pool size and the batch, its products one op each.

The kernel is installed with tfdet (compiled into its wheel, one library
per TensorFlow minor), else compiled at first use against the installed
TensorFlow and cached (`TFDET_KERNEL_CACHE` chooses the cache, which a
process without a compiler also reads). Where it is neither installed,
cached nor buildable, tfdet says so once and computes the products as
`pool_size_free_products` does, slower and with other bits; the profile's
`kernels` then leaves this patch out. Values agree with
TensorFlow's to float32 rounding. Other dtypes, products with an empty
dimension known when traced, and shapes that cannot multiply (its error)
go to TensorFlow's op; Einsum broadcasts ellipsis dimensions as
TensorFlow's does. A custom op does not
compile under XLA (`jit_compile=True`).

Installed by "auto" (`tfdet.enable()`'s default). Exports (`model.export`,
`tf.saved_model.save`) trace the composition instead
(`export_without_kernels`), so a SavedModel loads without tfdet. Cost:
`benchmarks/fixed_order_products.py`.
"""

from __future__ import annotations

from typing import Any

from tfdet._kernels import fixed_order
from tfdet._patching import _exact_math
from tfdet._patching._registry import Patch
from tfdet.patches import _geometry, _product_compositions

_MAT_MUL = _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", "mat_mul")
_BATCH_MAT_MUL = {
    version: _exact_math.GeneratedOp("tensorflow.python.ops.gen_math_ops", version)
    for version in ("batch_mat_mul_v2", "batch_mat_mul_v3")
}
_EINSUM = _exact_math.GeneratedOp("tensorflow.python.ops.gen_linalg_ops", "einsum")


def _left_to_tensorflow(op_type: str, dtype: Any, reason: str | None = None) -> None:
    _exact_math.left_to_tensorflow("fixed_order_products", op_type, dtype, reason)


def _batch_product(a: Any, b: Any, adj_x: bool, adj_y: bool) -> Any:
    """`a @ b` (batch dims broadcast): the kernel, or the composition."""
    if fixed_order.load() is not None:
        return fixed_order.batch_matmul(a, b, adj_x=adj_x, adj_y=adj_y)
    return _geometry.broadcast_batch_matmul(a, b, adj_x, adj_y)


def _cannot_multiply(
    a: Any, b: Any, adjoint_a: bool, adjoint_b: bool, matrices: bool
) -> bool:
    """Whether shapes known when traced cannot be multiplied.

    TensorFlow's op then raises its own error: `InvalidArgumentError` (or,
    traced, `ValueError`) with its own text, where the kernel's would say
    it in other words. `matrices`: MatMul's 2-D operands, else BatchMatMul's
    broadcast batches.
    """
    import tensorflow as tf

    if a.shape.rank is None or b.shape.rank is None:
        return False
    if min(a.shape.rank, b.shape.rank) < 2 or (
        matrices and max(a.shape.rank, b.shape.rank) > 2
    ):
        return True
    inner_a = a.shape[-2] if adjoint_a else a.shape[-1]
    inner_b = b.shape[-1] if adjoint_b else b.shape[-2]
    if inner_a is not None and inner_b is not None and inner_a != inner_b:
        return True
    try:
        tf.broadcast_static_shape(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return True
    return False


def mat_mul(
    a: Any,
    b: Any,
    transpose_a: bool = False,
    transpose_b: bool = False,
    name: str | None = None,
    **flags: Any,
) -> Any:
    """`tf.raw_ops.MatMul`, by the fixed-order kernel for float32."""
    import tensorflow as tf

    a_tensor, b_tensor = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    if _cannot_multiply(a_tensor, b_tensor, transpose_a, transpose_b, matrices=True):
        # TensorFlow's own op raises its own error (type and text), which
        # callers match (`Matrix size-incompatible`, `ndims must be >= 2`).
        return _MAT_MUL.original(
            a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name, **flags
        )
    if _geometry.mat_mul_left_to_tensorflow(a_tensor, b_tensor):
        _left_to_tensorflow("MatMul", a_tensor.dtype)
        return _MAT_MUL.original(
            a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name, **flags
        )
    with tf.name_scope(name or "PortableFixedOrderMatMul"):
        if fixed_order.load() is not None:
            return fixed_order.matmul(
                a_tensor, b_tensor, transpose_a=transpose_a, transpose_b=transpose_b
            )
        return _product_compositions.mat_mul(
            a_tensor, b_tensor, transpose_a, transpose_b
        )


def _batch_mat_mul(version: str) -> Any:
    """The replacement of `gen_math_ops.<version>` (BatchMatMulV2 or V3)."""

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

        original = _BATCH_MAT_MUL[version].original
        a, b = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        out_type = args[0] if args else flags.get("Tout", tf.float32)
        if _cannot_multiply(a, b, adj_x, adj_y, matrices=False):
            # TensorFlow's op raises its own error (see `mat_mul`).
            return original(x, y, *args, adj_x=adj_x, adj_y=adj_y, name=name, **flags)
        left, reason = _geometry.batch_mat_mul_left_to_tensorflow(a, b, out_type)
        if left:
            _left_to_tensorflow("BatchMatMul", a.dtype, reason)
            return original(x, y, *args, adj_x=adj_x, adj_y=adj_y, name=name, **flags)
        with tf.name_scope(name or "PortableFixedOrderBatchMatMul"):
            product = _batch_product(a, b, adj_x, adj_y)
            static_batch = tf.broadcast_static_shape(a.shape[:-2], b.shape[:-2])
            m = a.shape[-1] if adj_x else a.shape[-2]
            n = b.shape[-2] if adj_y else b.shape[-1]
            product.set_shape(static_batch.concatenate([m, n]))
            return product

    return batch_mat_mul


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
        _left_to_tensorflow("Einsum", tensors[0].dtype)
        return _EINSUM.original(inputs, equation, name=name)
    try:
        broadcast = _broadcast_ellipses(equation, tensors)
        result = special_math_ops._einsum_v1(equation, *broadcast, name=name)
    except ValueError:
        # A subscript the decomposition does not take (a diagonal, "ii->i"),
        # or an ellipsis of unknown rank in two inputs: TensorFlow's op
        # (which raises TensorFlow's error where the shapes do not fit).
        _left_to_tensorflow("Einsum", tensors[0].dtype, f"the equation {equation!r}")
        return _EINSUM.original(inputs, equation, name=name)
    # "...->..." decomposes to its input itself; TensorFlow's op gives a new
    # tensor (graph-mode gradients of an op's output taken as its own input
    # come out zero: EinsumGradTest.testUnaryEllipsis).
    if any(result is tensor for tensor in broadcast):
        result = tf.identity(result, name=name)
    return result


def _broadcast_ellipses(equation: str, tensors: list[Any]) -> list[Any]:
    """The inputs, their ellipsis dimensions broadcast against each other's.

    `_einsum_v1` takes an ellipsis in two inputs only where their
    dimensions are equal: a 1 against a larger one ("...ij,...jk->...ik" of
    [3, 1, 2, 3] and [1, 7, 3, 5]) failed when run, in a reshape. Einsum
    broadcasts them as NumPy does, so each such input is broadcast to the
    common ellipsis shape first (its copies hold the same values: the
    products' terms and their order are unchanged).

    Raises:
        ValueError: Where an input with an ellipsis has an unknown rank, or
            the ellipses cannot broadcast (the caller then leaves the
            equation to TensorFlow's op, which raises its own error).
    """
    import tensorflow as tf

    subscripts = equation.replace(" ", "").split("->")[0].split(",")
    spans = []  # (input, first ellipsis axis, axes after it) per ellipsis
    for index, subscript in enumerate(subscripts[: len(tensors)]):
        if "..." in subscript:
            start = subscript.index("...")
            spans.append((index, start, len(subscript) - start - 3))
    if len(spans) < 2:
        return tensors
    if any(tensors[index].shape.rank is None for index, _, _ in spans):
        raise ValueError("an ellipsis of unknown rank")

    def ellipsis(index: int, start: int, after: int) -> Any:
        return tensors[index].shape[start : tensors[index].shape.rank - after]

    shapes = [ellipsis(*span) for span in spans]
    known = {tuple(shape.as_list()) for shape in shapes if shape.rank}
    if len(known) <= 1 and all(shape.is_fully_defined() for shape in shapes):
        return tensors  # One ellipsis shape (or none but empty ones).
    static = shapes[0]
    for shape in shapes[1:]:
        static = tf.broadcast_static_shape(static, shape)  # ValueError if not
    rank = static.rank
    common = tf.shape(tensors[spans[0][0]])[spans[0][1] : spans[0][1] + shapes[0].rank]
    for (index, start, _), shape in zip(spans[1:], shapes[1:], strict=True):
        common = tf.broadcast_dynamic_shape(
            common, tf.shape(tensors[index])[start : start + shape.rank]
        )
    broadcast = list(tensors)
    for (index, start, _), shape in zip(spans, shapes, strict=True):
        dims = tf.shape(tensors[index])
        end = start + shape.rank
        # Right-aligned, as NumPy broadcasts: leading ones first.
        ones = tf.ones([rank - shape.rank], tf.int32)
        aligned = tf.reshape(
            tensors[index], tf.concat([dims[:start], ones, dims[start:]], 0)
        )
        broadcast[index] = tf.broadcast_to(
            aligned, tf.concat([dims[:start], common, dims[end:]], 0)
        )
    return broadcast


# The op types this patch computes apart from the pool size and the batch.
COVERED = ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")


def _apply(swap: Any) -> None:
    # Built (or found in the cache) now, so the first product does not
    # pay for the compiler, and a missing compiler is said at enable().
    fixed_order.load()
    _MAT_MUL.replace(swap, mat_mul)
    for version, op in _BATCH_MAT_MUL.items():
        op.replace(swap, _batch_mat_mul(version))
    _EINSUM.replace(swap, einsum)


PATCH = Patch(
    summary="MatMul, BatchMatMul, Einsum -> tfdet's fixed-order product kernel "
    "(one FMA chain per output element, split over output tiles: bits "
    "independent of the pool size, the batch and the vector width)",
    upstream="https://github.com/uxlfoundation/oneDNN/issues/1443",
    apply=_apply,
    kernel=fixed_order.LIBRARY,
    cpu_only=True,
)
