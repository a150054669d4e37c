"""Bits that follow neither the thread-pool size nor the batch.

With oneDNN on, TensorFlow's CPU `MatMul` is oneDNN's sgemm, whose work is
split among the pool's threads by output columns (and, with AVX2, capped by
the L2 cache per core): the last columns of each thread's share go through
a remainder micro-kernel that sums with other accumulators (two partial
sums for even and odd k, or multiply-then-add instead of FMA), so which
columns end up in a remainder, and so their bits, follow the pool size, and
which rows do follow the number of rows: a sample's bits follow its batch.
`Conv2DBackpropFilter` (oneDNN's backward-by-weights) splits its sum over
the batch and the image among threads when it has few jobs and adds the
partial sums afterwards; `Conv2DBackpropInput` of a strided convolution
splits by the pool too; `BiasAddGrad` (TensorFlow's `ReduceOuterDimensions`)
splits the rows into up to one block per thread when there are few
channels. Each gives other bits with another pool size, under one seed.

oneDNN's forward convolution splits work only over its outputs (images,
output channels, positions) and sums every output's channels inside one
thread, in the same order whatever the pool size and whatever the number of
images from two on (docs/measurements.md, "Cost of bits that do not follow
the pool size" and "Batch size"). So this patch computes
each product as one:

- `MatMul` a (m x k) @ b (k x n): a 1x1 convolution by an (1, 1, k, n)
  filter of images of 8 pixels (rows of a) with k channels, each image
  computed by one thread; its gradients are the same kind of product
  (dy @ b^T, a^T @ dy), never sgemm;
- `BatchMatMulV2/V3` (batch, m, k) @ (batch, k, n): the same, with one
  convolution group per batch entry (batch shapes broadcast, known or not
  when traced); `Einsum` through TensorFlow's Python decomposition
  (`_einsum_v1`: transposes, reshapes and those products);
- `Conv2D`: TensorFlow's, but never on a batch of one image, which oneDNN
  computes with another kernel (one zero image beside it);
- `Conv2DBackpropFilter`: the image patches (strided slices, a copy)
  transposed, times the output gradient, as above;
- `Conv2DBackpropInput`: a forward convolution of the output gradient
  (zeros between its values for a stride, padded by the filter's reach) by
  the filter reversed in space, its channels swapped;
- `BiasAddGrad`: a `Sum` over every axis but the channels, which splits
  only over the channels;
- `DepthwiseConv2dNativeBackpropFilter` (depthwise and separable
  convolutions' filter gradient, which TensorFlow splits by images): per
  filter position, such a `Sum` of the input's strided slice times the
  output gradient;
- tf_keras's `BatchNormalization`: computed unfused (`tf.nn.moments`, a
  `Mean` over every axis but the channels, and element-wise ops) instead of
  the fused kernel (`FusedBatchNormV3`), whose training-time sums over the
  batch split by the pool (a layer asked for `fused=True` too); Keras 3's
  is unfused already;
- `tf.nn.gelu`'s exact form without the division that Grappler rewrites in
  a traced function on TensorFlow 2.16-2.18 (eager and traced agree);
- element-wise functions whose last `length % lanes` elements Eigen
  computes with another approximation (Sigmoid, Exp, Log, Softplus, Elu,
  Pow, ...: `tfdet.patches._whole_packets`): on whole packets.

Together: with the patch, each sample's output bits do not depend on what
else is in its batch (`model.predict` at any batch size, in any order, or
`model(x[i:j])`), and a model's weights do not depend on the pool size.
Except under TensorFlow 2.19's oneDNN (v3.5), which on some CPUs (an AMD
Zen 3) computes a 1x1 convolution of 1024 input channels and more with
one kernel from 8 images on and another below: there a product's bits
follow the batch (`fixed_order_products` keeps them).

Values agree with the originals to float32 rounding (the sums run in
another order). float32 only (NHWC for convolutions); anything else, and
what the replacements cannot compute (a product with an empty dimension, a
grouped convolution's gradients, an `Einsum` with a diagonal such as
"ii->i"), goes to the original op. Not covered (still following the pool
size with the patch): 3-D convolution filter gradients, and a full `Sum`
or `Mean` large enough for Eigen to split it into one block per thread
(of 256x4096 elements; a training step's loss, a mean over one batch,
stays on one thread). Cost:
`benchmarks/patch_cost.py --patch pool_size_free_products`,
`benchmarks/cost_of_determinism.py` and `benchmarks/batch_invariance.py`.

Installed by "auto" (`tfdet.enable()`'s default), with tfdet's kernels
computing the products and convolutions where they load; `tfdet check
--perturb threads` shows it on a model.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdet._patching import _exact_math, _registry
from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap
from tfdet.patches import _convolution_compositions as convolutions
from tfdet.patches import _product_compositions as products
from tfdet.patches import _whole_packets

# The replacements are written by op family in `_product_compositions` and
# `_convolution_compositions` (which `fixed_order_*` fall back to); this
# module decides which of them to bind.

# The op types this patch computes apart from the pool size.
COVERED = (
    "Conv2DBackpropInput",
    "MatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2DBackpropFilter",
    "DepthwiseConv2dNativeBackpropFilter",
    "BiasAddGrad",
    # Not replaced: tf_keras's BatchNormalization, which reaches it, is
    # built unfused instead (a direct `tf.nn.fused_batch_norm` still runs it).
    "FusedBatchNormV3",
)
# The op types this patch computes apart from the batch size (and with
# them, `COVERED`): each sample's bits do not follow what else is in its
# batch.
BATCH_SIZE_FREE = (*COVERED, "Conv2D", "Pow", *_whole_packets.UNARY)


# tfdet's own product kernel: with these installed (before this patch, in
# name order), the products (the convolutions) are its, one op each instead
# of a padded convolution and its plumbing, as free of the pool size and the
# batch (where it cannot compute one, it calls this patch's composition).
_KERNEL_PRODUCTS = "fixed_order_products"
_KERNEL_CONVOLUTIONS = "fixed_order_convolutions"


def warn_without_onednn() -> None:
    """Says once that the bits follow the pool size where oneDNN is off.

    The compositions (`_product_compositions`, `_convolution_compositions`)
    rely on oneDNN's forward convolution, which splits work over outputs
    only. Without oneDNN (enable()'s default on aarch64, or `onednn=None`
    where TensorFlow leaves it off) Eigen's convolution computes them, and measured on emulated aarch64 (QEMU `max`,
    TF 2.21) the built-in CNN and BatchNorm + GELU model trained to other
    weights with pools of 1 and 3 under this patch.
    """
    from tfdet._pin import _environment

    if _environment.onednn_custom_ops() is False:
        _exact_math.warn_once(
            "tfdet: pool_size_free_products computes its products through "
            "oneDNN's convolution, and TensorFlow's oneDNN custom ops are off "
            "here: the bits may still follow the thread-pool size (measured on "
            "aarch64). Use threads=1 for bits that do not."
        )


def _apply(swap: Any) -> None:

    warn_without_onednn()
    installed = _registry.installed()
    if _KERNEL_PRODUCTS not in installed:
        products.MAT_MUL.replace(swap, products.mat_mul)
        for version, op in products.BATCH_MAT_MUL.items():
            op.replace(swap, products.batch_mat_mul_replacement(version))
        products.EINSUM.replace(swap, products.einsum)
    if _KERNEL_CONVOLUTIONS not in installed:
        convolutions.CONV.replace(swap, convolutions.conv2d)
        convolutions.FILTER_GRAD.replace(swap, convolutions.conv2d_backprop_filter)
        convolutions.INPUT_GRAD.replace(swap, convolutions.conv2d_backprop_input)
        convolutions.DEPTHWISE_FILTER_GRAD.replace(
            swap, convolutions.depthwise_conv2d_native_backprop_filter
        )
    products.GELU.replace(swap, products.gelu)
    convolutions.BIAS_GRAD.replace(swap, convolutions.bias_add_grad)
    _whole_packets.apply(swap)


def _unfused_tf_keras_batch_norm(swap: Swap) -> None:
    """tf_keras's `BatchNormalization` layers are built unfused.

    `build` decides: it keeps `fused` False, so the layer computes its
    batch statistics with `tf.nn.moments` (covered above) wherever the
    fused kernel would have run.
    """
    from tf_keras.src.layers.normalization import batch_normalization

    base = batch_normalization.BatchNormalizationBase
    original = base.build

    @functools.wraps(original)
    def build(self: Any, input_shape: Any) -> None:
        self.fused = False
        original(self, input_shape)

    swap.attribute(base, "build", build)


PATCH = Patch(
    summary="MatMul, BatchMatMul, Einsum, Conv2D and its gradients, the depthwise "
    "filter gradient, BiasAddGrad, "
    "Sigmoid/Exp/Log/..., tf_keras' fused BatchNormalization -> 1x1 "
    "convolutions, Sums, whole packets and unfused moments that split only over "
    "outputs (bits independent of the pool size and the batch)",
    upstream="https://github.com/uxlfoundation/oneDNN/issues/1443",
    apply=_apply,
    after_import=(("tf_keras", _unfused_tf_keras_batch_norm),),
    cpu_only=True,
)
