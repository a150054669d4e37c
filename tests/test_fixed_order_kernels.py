"""tfdet's fixed-order product kernel: bits fixed by the shapes alone.

Its values agree with `tf.matmul`, `tf.raw_ops.Conv2D` and the depthwise
convolution's filter gradient to float32 rounding (forward and both
gradients, every transpose, broadcast batches, strides, paddings,
dilations); its bits do not follow the row count (a row
computed in a batch of 96 equals the row computed alone, an image's
convolution and input gradient in a batch of 12 equal them computed alone),
the micro-kernel's vector width (AVX-512, AVX2 and scalar paths), nor the pool size
(fresh processes with pools 1, 2, 3, 4, 6, 8). Each invariance has its control:
TensorFlow's own op under the same perturbation gives other bits.
The kernel is built once for the suite (`TFDET_KERNEL_CACHE`, set by
tests/conftest.py, shared by pytest-xdist's workers and the processes they
start).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, TENSORFLOW_PRODUCTS, clean_env, last_json_line
from tfdet._kernels import fixed_order
from tfdet._kernels import library as kernel_library
from tfdet._pin import _isa


@pytest.fixture(scope="session")
def kernels():
    """The loaded kernel module, built once (conftest's shared cache)."""
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: the kernel cannot be built")
    assert fixed_order.load() is not None
    return fixed_order


def _bits(tensor) -> bytes:
    return np.ascontiguousarray(np.asarray(tensor)).tobytes()


# (m, k, n): one micro-tile, edges in every direction, K over one K block;
# 96 columns, which the kernel reads in place.
SHAPES = (
    (1, 1, 1),
    (7, 13, 17),
    (6, 16, 16),
    (97, 300, 50),
    (32, 1000, 70),
    (64, 300, 96),
)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_values_and_gradients_match_tf_matmul(kernels, shape, transpose_a, transpose_b):
    import tensorflow as tf

    m, k, n = shape
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(k, m) if transpose_a else (m, k)), tf.float32)
    b = tf.constant(rng.normal(size=(n, k) if transpose_b else (k, n)), tf.float32)
    upstream = tf.constant(rng.normal(size=(m, n)), tf.float32)
    found = []
    for product in (kernels.matmul, tf.matmul):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            c = product(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        found.append([c, *tape.gradient(c, [a, b], output_gradients=upstream)])
    # Float32 rounding of sums of K (or m, n) terms, relative to the largest.
    for ours, theirs in zip(*found, strict=True):
        scale = max(float(np.abs(theirs).max()), 1e-30)
        terms = max(m, k, n)
        assert np.abs(ours - theirs).max() / scale < 1e-5 * np.sqrt(terms)


def test_batched_products_broadcast_like_tensorflow(kernels):
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(4, 1, 5, 7)), tf.float32)
    y = tf.constant(rng.normal(size=(3, 6, 7)), tf.float32)
    upstream = tf.constant(rng.normal(size=(4, 3, 5, 6)), tf.float32)
    found = []
    for product in (
        lambda x, y: kernels.batch_matmul(x, y, adj_y=True),
        lambda x, y: tf.matmul(x, y, adjoint_b=True),
    ):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            c = product(x, y)
        found.append([c, *tape.gradient(c, [x, y], output_gradients=upstream)])
    for ours, theirs in zip(*found, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_empty_dimensions_give_tensorflows_shapes(kernels):
    import tensorflow as tf

    assert kernels.matmul(tf.zeros([0, 3]), tf.zeros([3, 4])).shape == (0, 4)
    # No terms to sum: zeros, as TensorFlow gives.
    assert not np.any(kernels.matmul(tf.ones([3, 0]), tf.ones([0, 4])))


def test_rows_do_not_follow_the_batch(kernels):
    """Row r of a product of 96 rows equals row r computed in 1, 5 or 32."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(96, 512)), tf.float32)
    w = tf.constant(rng.normal(size=(512, 256)), tf.float32)
    whole = kernels.matmul(x, w).numpy()
    for rows in (1, 5, 32):
        part = kernels.matmul(x[:rows], w).numpy()
        assert _bits(part) == _bits(whole[:rows]), rows


# (image shape NHWC, (filter rows, columns, filters), strides, padding,
# dilation): edges of every micro-tile, strides 2 and (2, 3), SAME, VALID
# and explicit paddings, dilated filters, a strided 1x1, a 7x7 stem, and a
# tap's run of channels longer than a K block (300).
CONVOLUTIONS = (
    ((2, 9, 9, 3), (3, 3, 8), (1, 1), "SAME", 1),
    ((2, 9, 9, 3), (3, 3, 8), (2, 2), "SAME", 1),
    ((3, 10, 7, 5), (3, 2, 17), (2, 3), "VALID", 1),
    ((2, 12, 12, 4), (3, 3, 6), (1, 1), "SAME", 2),
    ((2, 8, 8, 7), (1, 1, 9), (2, 2), "VALID", 1),
    ((1, 16, 16, 3), (7, 7, 20), (2, 2), "SAME", 1),
    ((2, 8, 8, 4), (3, 3, 5), (1, 1), [0, 0, 1, 2, 0, 1, 0, 0], 1),
    # Runs of channels (filters) longer than a micro-tile's 16 columns.
    ((2, 9, 9, 20), (3, 3, 24), (2, 2), "SAME", 1),
    ((2, 8, 8, 32), (3, 3, 16), (1, 1), "VALID", 2),
    ((3, 7, 9, 17), (2, 3, 33), (2, 1), [0, 0, 2, 1, 1, 0, 0, 0], 1),
    ((2, 6, 6, 300), (1, 1, 40), (1, 1), "VALID", 1),
    # 32 filters and more: the filter gradient in the filter's own layout,
    # its panels of (tap, channel) rows within one tap and across taps.
    ((2, 12, 12, 3), (3, 3, 48), (1, 1), "SAME", 2),
    ((2, 9, 9, 12), (3, 3, 64), (2, 2), [0, 0, 1, 0, 2, 1, 0, 0], 1),
    # Fewer channels than a panel's rows: a filter row's taps read as one
    # span of neighbouring pixels, assembled tap by tap where it hangs over
    # the image's side (a first layer's 7x7 at stride 2, explicit padding).
    ((2, 11, 11, 3), (7, 7, 32), (2, 2), "SAME", 1),
    ((2, 9, 9, 2), (3, 3, 40), (1, 1), [0, 0, 1, 2, 2, 0, 0, 0], 1),
    ((2, 8, 8, 4), (3, 3, 32), (1, 2), "VALID", 1),
    # 32 filters and 8 channels, dilated and strided without padding: the
    # AVX-512 path's filter gradient reads each tap's pixels in place.
    ((2, 13, 12, 8), (3, 3, 32), (2, 1), "VALID", 2),
    # A 1x1 filter at stride 1: the image read in place as the filter
    # gradient's B (fewer than 32 filters, its transposed form).
    ((2, 5, 7, 32), (1, 1, 24), (1, 1), "SAME", 1),
)


def _convolution(kernels, x, w, strides, padding, dilation):
    """The kernel's Conv2D and TensorFlow's on the same inputs.

    TensorFlow's CPU gradients refuse dilations, so its filter is the
    dilated one written out, zeros between the taps.
    """
    import tensorflow as tf

    explicit = padding if isinstance(padding, list) else []
    padding = "EXPLICIT" if explicit else padding
    attributes = {"strides": [1, *strides, 1], "padding": padding}
    rows, columns, channels, filters = w.shape
    spread = tf.scatter_nd(
        [[i * dilation, j * dilation] for i in range(rows) for j in range(columns)],
        tf.reshape(w, [rows * columns, channels, filters]),
        [(rows - 1) * dilation + 1, (columns - 1) * dilation + 1, channels, filters],
    )
    ours = kernels.conv2d(
        x, w, explicit_paddings=explicit, dilations=[1, dilation, dilation, 1],
        **attributes,
    )  # fmt: skip
    theirs = tf.raw_ops.Conv2D(
        input=x, filter=spread, explicit_paddings=explicit, **attributes
    )
    return ours, theirs


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=lambda case: str(case[:4]))
def test_convolutions_and_their_gradients_match_tensorflow(kernels, case):
    import tensorflow as tf

    image, (rows, columns, filters), strides, padding, dilation = case
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=image), tf.float32)
    w = tf.constant(rng.normal(size=(rows, columns, image[3], filters)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        ours, theirs = _convolution(kernels, x, w, strides, padding, dilation)
    upstream = tf.constant(rng.normal(size=theirs.shape), tf.float32)
    found = [
        [y, *tape.gradient(y, [x, w], output_gradients=upstream)]
        for y in (ours, theirs)
    ]
    graph = tf.function(kernels.conv2d).get_concrete_function(
        tf.TensorSpec([None, None, None, image[3]]), w, strides=[1, *strides, 1],
        padding="SAME",
    ).graph  # fmt: skip
    assert {"TfdetFixedOrderConv2D"} <= {op.type for op in graph.get_operations()}
    for name, mine, reference in zip(("y", "dx", "dw"), *found, strict=True):
        assert mine.shape == reference.shape, name
        scale = max(float(np.abs(reference).max()), 1e-30)
        assert np.abs(mine - reference).max() / scale < 1e-5, name


def _patches(x, rows, columns, strides, paddings, dilation):
    """im2col in numpy: (batch x out_h x out_w) x (rows x columns x channels)."""
    (top, bottom), (left, right) = paddings
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    out_h = (padded.shape[1] - (rows - 1) * dilation - 1) // strides[0] + 1
    out_w = (padded.shape[2] - (columns - 1) * dilation - 1) // strides[1] + 1
    taps = [
        padded[
            :,
            i * dilation : i * dilation + (out_h - 1) * strides[0] + 1 : strides[0],
            j * dilation : j * dilation + (out_w - 1) * strides[1] + 1 : strides[1],
        ]
        for i in range(rows)
        for j in range(columns)
    ]
    patches = np.stack(taps, axis=3)  # batch, out_h, out_w, tap, channel
    return patches.reshape(-1, rows * columns * x.shape[3]), (out_h, out_w)


def _filter_gradient_and_patch_product(
    kernels, rng, image, size, strides, paddings, dilation, filters
):
    """The op's filter gradient, and the kernel's product of the patches
    written out (transposed) with the output gradient, in the filter's shape."""
    import tensorflow as tf

    rows, columns = size
    x = rng.normal(size=image).astype(np.float32)
    patches, (out_h, out_w) = _patches(x, rows, columns, strides, paddings, dilation)
    upstream = rng.normal(size=(image[0], out_h, out_w, filters)).astype(np.float32)
    gradient = kernels.conv2d_backprop_filter(
        tf.constant(x),
        tf.constant([rows, columns, image[3], filters]),
        tf.constant(upstream),
        strides=[1, *strides, 1],
        padding="EXPLICIT",
        explicit_paddings=[0, 0, *paddings[0], *paddings[1], 0, 0],
        dilations=[1, dilation, dilation, 1],
    )
    product = kernels.matmul(
        tf.constant(patches), tf.constant(upstream.reshape(-1, filters)),
        transpose_a=True,
    )  # fmt: skip
    return gradient, tf.reshape(product, gradient.shape)


# (image, filter size, strides, paddings, dilation, filters): a filters
# count of None takes the test's parameter.
FILTER_GRADIENTS = (
    ((2, 9, 9, 3), (3, 3), (1, 1), ((1, 1), (1, 1)), 1, None),
    ((3, 11, 10, 13), (3, 2), (2, 1), ((2, 0), (1, 1)), 2, None),
    # 16384 positions x 256 filters: each task packs its own output
    # gradient blocks.
    ((64, 16, 16, 4), (1, 1), (1, 1), ((0, 0), (0, 0)), 1, 256),
)


@pytest.mark.parametrize("filters", [8, 24, 32, 40, 64])
def test_the_filter_gradient_has_the_bits_of_the_product_over_its_patches(
    kernels, filters
):
    """Whichever layout the op computes in (filters-major and transposed,
    under 32 filters; the filter's own from 32 on), each weight is the chain
    over its patches in order: the bits of the kernel's own product of the
    patches, written out, and the output gradient."""
    rng = np.random.default_rng(7)
    for *geometry, count in FILTER_GRADIENTS:
        if count is not None and filters != 64:
            continue
        gradient, product = _filter_gradient_and_patch_product(
            kernels, rng, *geometry, count or filters
        )
        assert _bits(gradient) == _bits(product), (geometry, count or filters)


# Depthwise filter gradients (image, filter size, strides, padding,
# dilation): 16-channel blocks and a tail (37 channels), a stride, a
# dilation (which TensorFlow's Python wrapper computes through
# space_to_batch), explicit padding, and a filter 9 wide (the scalar path).
DEPTHWISE = (
    ((4, 9, 11, 37), (3, 3), 1, "SAME", 1),
    ((3, 12, 13, 32), (3, 3), 2, "VALID", 1),
    ((2, 11, 10, 40), (3, 3), 1, "SAME", 2),
    ((2, 7, 8, 16), (2, 3), 1, [[0, 0], [1, 2], [0, 1], [0, 0]], 1),
    ((2, 6, 12, 16), (1, 9), 1, "SAME", 1),
)


@pytest.mark.parametrize("case", DEPTHWISE, ids=lambda case: str(case[:3]))
def test_the_depthwise_filter_gradient_matches_tensorflow(kernels, case):
    import tensorflow as tf

    from tfdet.patches import fixed_order_convolutions

    image, (rows, columns), stride, padding, dilation = case
    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(size=image), tf.float32)
    w = tf.constant(rng.normal(size=(rows, columns, image[3], 1)), tf.float32)
    strides = [1, stride, stride, 1]
    with tf.GradientTape() as tape:
        tape.watch(w)
        y = tf.nn.depthwise_conv2d(x, w, strides, padding, dilations=[dilation] * 2)
    upstream = tf.constant(rng.normal(size=y.shape), tf.float32)
    reference = tape.gradient(y, w, output_gradients=upstream)
    explicit = not isinstance(padding, str)
    mine = kernels.depthwise_conv2d_backprop_filter(
        x,
        tf.shape(w),
        upstream,
        strides=strides,
        padding="EXPLICIT" if explicit else padding,
        explicit_paddings=sum(padding, []) if explicit else [],
        dilations=[1, dilation, dilation, 1],
    )
    scale = float(np.abs(reference).max())
    assert np.abs(mine - reference).max() / scale < 1e-5
    # The patch's replacement takes TensorFlow's op out of a traced step.
    replacement = fixed_order_convolutions.depthwise_conv2d_native_backprop_filter
    graph = tf.function(
        lambda x, dy: replacement(x, [rows, columns, image[3], 1], dy, strides, "SAME")
    ).get_concrete_function(
        tf.TensorSpec([None, *image[1:]]), tf.TensorSpec([None, *y.shape[1:]])
    )
    ops = {op.type for op in graph.graph.get_operations()}
    assert "TfdetFixedOrderDepthwiseConv2dNativeBackpropFilter" in ops, ops
    assert "DepthwiseConv2dNativeBackpropFilter" not in ops, ops


def test_second_derivatives_of_a_convolution_match_tensorflow(kernels):
    """The gradient ops' own gradients (a gradient penalty's, say) are the
    kernel's too, with TensorFlow's values."""
    import tensorflow as tf

    rng = np.random.default_rng(6)
    x = tf.constant(rng.normal(size=(2, 7, 7, 5)), tf.float32)
    w = tf.constant(rng.normal(size=(3, 3, 5, 6)), tf.float32)
    attributes = {"strides": [1, 2, 2, 1], "padding": "SAME"}
    found = []
    for convolve in (
        lambda x, w: kernels.conv2d(x, w, **attributes),
        lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, **attributes),
    ):
        with tf.GradientTape(persistent=True) as outer:
            outer.watch([x, w])
            with tf.GradientTape(persistent=True) as inner:
                inner.watch([x, w])
                loss = tf.reduce_sum(tf.square(convolve(x, w)))
            dx, dw = inner.gradient(loss, [x, w])
            penalties = tf.reduce_sum(tf.square(dx)), tf.reduce_sum(tf.square(dw))
        found.append(
            [g for penalty in penalties for g in outer.gradient(penalty, [x, w])]
        )
    for mine, reference in zip(*found, strict=True):
        scale = max(float(np.abs(reference).max()), 1e-30)
        assert np.abs(mine - reference).max() / scale < 1e-5


def test_an_images_convolution_does_not_follow_the_batch(kernels):
    """An image's output and input gradient in a batch of 12 equal it alone."""
    import tensorflow as tf

    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(size=(12, 10, 10, 16)), tf.float32)
    w = tf.constant(rng.normal(size=(3, 3, 16, 24)), tf.float32)
    upstream = tf.constant(rng.normal(size=(12, 5, 5, 24)), tf.float32)

    def forward_and_input_gradient(images):
        kept = upstream[: images.shape[0]]
        attributes = {"strides": [1, 2, 2, 1], "padding": "SAME"}
        return (
            kernels.conv2d(images, w, **attributes).numpy(),
            kernels.conv2d_backprop_input(
                tf.shape(images), w, kept, **attributes
            ).numpy(),
        )

    whole = forward_and_input_gradient(x)
    for images in (1, 5):
        part = forward_and_input_gradient(x[:images])
        for mine, reference in zip(part, whole, strict=True):
            assert _bits(mine) == _bits(reference[:images]), images


# The kernel's vector paths that this CPU can run, each but the widest asked
# for by name (the widest is the default, with no variable).
PATHS = ("avx2", "scalar") if "avx2" in _isa.cpu_flags() else ("scalar",)
HAS_AVX512 = "avx512f" in _isa.cpu_flags()


def _path_results(kernels, monkeypatch, path):
    """Products, a batched product and a convolution's three ops by `path`."""
    import tensorflow as tf

    if path:
        monkeypatch.setenv(fixed_order.ISA_VARIABLE, path)
    else:
        monkeypatch.delenv(fixed_order.ISA_VARIABLE, raising=False)
    rng = np.random.default_rng(3)
    # Widths of 40, 18, 19 and 77 columns: whole AVX-512 pairs of 16-column
    # micro-tiles, a lone micro-tile beside them, and edges of each.
    a = tf.constant(rng.normal(size=(50, 700)), tf.float32)
    b = tf.constant(rng.normal(size=(700, 77)), tf.float32)
    # 96 columns, read in place (a pair and a lone micro-tile); 48 columns
    # of a transposed operand, packed 8x8 at a time with a 4-term tail of
    # the last K block (700 = 256 + 256 + 188).
    b_in_place = tf.constant(rng.normal(size=(700, 96)), tf.float32)
    b_transposed = tf.constant(rng.normal(size=(48, 700)), tf.float32)
    x = tf.constant(rng.normal(size=(3, 9, 20)), tf.float32)
    y = tf.constant(rng.normal(size=(3, 20, 40)), tf.float32)

    images = tf.constant(rng.normal(size=(3, 9, 9, 5)), tf.float32)
    w = tf.constant(rng.normal(size=(3, 3, 5, 19)), tf.float32)
    upstream = tf.constant(rng.normal(size=(3, 5, 5, 19)), tf.float32)
    attributes = {"strides": [1, 2, 2, 1], "padding": "SAME"}
    # 37 channels: two whole 16-lane blocks of the depthwise kernel, a tail.
    depthwise = tf.constant(rng.normal(size=(3, 9, 9, 37)), tf.float32)
    depthwise_upstream = tf.constant(rng.normal(size=(3, 5, 5, 37)), tf.float32)
    # Long sums, cut into K blocks: 9,000 terms (two blocks of 4,608 and
    # 4,392) and a filter gradient over 8 x 32 x 32 positions.
    long_a = tf.constant(rng.normal(size=(20, 9000)), tf.float32)
    long_b = tf.constant(rng.normal(size=(9000, 40)), tf.float32)
    long_images = tf.constant(rng.normal(size=(8, 34, 34, 3)), tf.float32)
    long_upstream = tf.constant(rng.normal(size=(8, 32, 32, 19)), tf.float32)
    valid = {"strides": [1, 1, 1, 1], "padding": "VALID"}
    # Filter gradients in the filter's own layout (32 filters or more), which
    # the AVX-512 path reads from the image where a micro-row's channels lie
    # in one tap, packing only the micro-rows that span two taps: 13
    # channels at stride 2 with padding (64 filters, two pairs), and 8
    # channels over 8,192 positions (two K blocks, 32 filters).
    direct_images = tf.constant(rng.normal(size=(3, 9, 9, 13)), tf.float32)
    direct_upstream = tf.constant(rng.normal(size=(3, 5, 5, 64)), tf.float32)
    long_direct = tf.constant(rng.normal(size=(8, 34, 34, 8)), tf.float32)
    long_direct_upstream = tf.constant(rng.normal(size=(8, 32, 32, 32)), tf.float32)
    # Convolutions whose micro-rows the AVX-512 path reads where they lie,
    # a tap at a time: 37 channels and 40 filters (K blocks of 256 terms
    # that end inside a tap; a pair of micro-tiles and a lone one beside
    # it), 189 positions (a short last micro-row), padding on every side,
    # and the input gradient at strides 1 and 2.
    rows_images = tf.constant(rng.normal(size=(3, 7, 9, 37)), tf.float32)
    rows_filter = tf.constant(rng.normal(size=(3, 3, 37, 40)), tf.float32)
    rows_upstream = tf.constant(rng.normal(size=(3, 7, 9, 40)), tf.float32)
    strided_upstream = tf.constant(rng.normal(size=(3, 4, 5, 40)), tf.float32)
    same = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    results = [
        kernels.conv2d(rows_images, rows_filter, **same),
        kernels.conv2d_backprop_input(
            tf.shape(rows_images), rows_filter, rows_upstream, **same
        ),
        kernels.conv2d_backprop_input(
            tf.shape(rows_images), rows_filter, strided_upstream, **attributes
        ),
        kernels.conv2d_backprop_filter(
            direct_images, [3, 3, 13, 64], direct_upstream, **attributes
        ),
        kernels.conv2d_backprop_filter(
            long_direct, [3, 3, 8, 32], long_direct_upstream, **valid
        ),
        kernels.matmul(long_a, long_b),
        kernels.conv2d_backprop_filter(
            long_images, [3, 3, 3, 19], long_upstream, **valid
        ),
        kernels.matmul(a, b),
        kernels.matmul(b, a, transpose_a=True, transpose_b=True),
        kernels.matmul(a, b_in_place),
        kernels.matmul(a, b_transposed, transpose_b=True),
        kernels.batch_matmul(x, y),
        kernels.conv2d(images, w, **attributes),
        kernels.conv2d_backprop_input(tf.shape(images), w, upstream, **attributes),
        kernels.conv2d_backprop_filter(images, tf.shape(w), upstream, **attributes),
        kernels.depthwise_conv2d_backprop_filter(
            depthwise, [3, 3, 37, 1], depthwise_upstream, **attributes
        ),
    ]
    return [_bits(r) for r in results]


def _parallelism():
    """benchmarks/kernel_parallelism.py (the kernels' split, from the
    shapes), loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        "kernel_parallelism", REPO / "benchmarks" / "kernel_parallelism.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Its dataclass looks itself up there.
    spec.loader.exec_module(module)
    return module


# Under an address-space limit with room for TensorFlow's own product of a
# (1, 4096) row by a (4096, 16384) B (256 MiB) but not for the copy of B the
# kernel packs first (more columns than it reads in place): TensorFlow's
# product, the control, runs; the kernel's must fail as TensorFlow's ops do,
# where an unchecked allocation would write through null.
OUT_OF_MEMORY = """
import json, resource
import numpy as np
import tensorflow as tf
from tfdet._kernels import fixed_order

def address_space():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

a = tf.constant(np.ones((1, 4096), np.float32))
b = tf.constant(np.ones((4096, 16384), np.float32))
small = tf.constant(np.ones((8, 8), np.float32))
fixed_order.matmul(small, small)  # the library and the pools, loaded first
tf.matmul(a, b)
limit = address_space() + (128 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
found = {}
for name, product in (("tensorflow", tf.matmul), ("kernel", fixed_order.matmul)):
    try:
        found[name] = float(tf.reduce_sum(product(a, b)))
    except Exception as error:
        found[name] = type(error).__name__
print(json.dumps(found))
"""


@pytest.mark.slow
def test_scratch_the_kernel_cannot_have_is_tensorflows_resource_exhausted_error(
    kernels,
):
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY],
        env=clean_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = last_json_line(done.stdout)
    if found["tensorflow"] != 4096 * 16384:
        pytest.skip(f"the limit left TensorFlow's own product no room: {found}")
    assert found["kernel"] == "ResourceExhaustedError"


@pytest.mark.parametrize("k", [8000, 8192, 9000, 28800, 70000])
def test_a_long_sum_is_its_k_blocks_added_in_order(kernels, k):
    """A sum of 8,192 terms or more is cut into K blocks fixed by K alone,
    each block a chain from zero, and the blocks' sums added in order: the
    product is bit for bit the sum, in order, of the shorter products over
    the blocks that the kernel's plan (`fixed_order.plan`, which the
    parallelism table reads) says (each below the cut, one chain), and its
    rows still do not follow their count. Below the cut (8,000 terms), one
    chain: not the sum of two halves."""
    import tensorflow as tf

    blocks = kernels.plan(1, 7, 20, k, pool=1)["k_blocks"]
    assert blocks == kernels.plan(1, 3, 20, k, pool=64)["k_blocks"]
    rng = np.random.default_rng(k)
    a = tf.constant(rng.normal(size=(7, k)), tf.float32)
    b = tf.constant(rng.normal(size=(k, 20)), tf.float32)
    whole = kernels.matmul(a, b).numpy()
    length = -(-k // max(blocks, 2))  # Two halves where there is one block.
    length = -(-length // 256) * 256
    sums = [
        kernels.matmul(a[:, start : start + length], b[start : start + length]).numpy()
        for start in range(0, k, length)
    ]
    total = sums[0]
    for partial in sums[1:]:
        total = total + partial
    assert (_bits(whole) == _bits(total)) == (blocks > 1), (k, blocks)
    assert _bits(kernels.matmul(a[:3], b)) == _bits(whole[:3])
    reference = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(whole, reference, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("path", [None, "avx2"])
@pytest.mark.parametrize("pool", [16, 64])
def test_no_zoo_kernel_call_leaves_a_quarter_of_its_threads_idle(
    kernels, monkeypatch, pool, path
):
    """Every fixed-order call of the zoo's training steps (the recorded
    table, `benchmarks/kernel_parallelism.json`) has tasks enough for at
    least three quarters of the threads it may use at a pool of 16 and 64,
    by the kernel's own plan, on the widest vector path and on AVX2 (whose
    single micro-tiles tile otherwise): a later change to the tiling or the
    K blocks cannot quietly serialise a kernel. The control: a call whose
    one output tile and 16 K blocks cannot keep 64 threads busy is found
    short, so the bound can fail. (At 16 threads no call that may use them
    has fewer than 16 tasks: the K blocks alone give 16.)"""
    if path is not None:
        monkeypatch.setenv(fixed_order.ISA_VARIABLE, path)
    parallelism = _parallelism()
    record = json.loads((REPO / "benchmarks" / "kernel_parallelism.json").read_text())
    short = [
        (row["model"], row["op"], row["shape"], plan)
        for row in record
        if parallelism.short_of_tasks(plan := parallelism.Call.of_row(row).plan(pool))
    ]
    assert not short
    # At 16 threads no call long enough to use them has fewer than 16 tasks.
    control = parallelism.Call("MatMul", 1, 6, 32, 1 << 26).plan(64)
    assert parallelism.short_of_tasks(control), control


def test_the_parallelism_record_is_the_zoos_calls():
    """The recorded table's calls for the built-in CNN are those its
    training step makes now (traced afresh by the benchmark, in a process of
    its own), and the benchmark passes its own bound on them."""
    import tempfile
    from pathlib import Path

    record = json.loads((REPO / "benchmarks" / "kernel_parallelism.json").read_text())
    with tempfile.TemporaryDirectory() as directory:
        fresh = Path(directory) / "cnn.json"
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "kernel_parallelism.py"),
             "--models", "builtin:cnn", "--json", str(fresh)],
            env=clean_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        rows = json.loads(fresh.read_text())

    def calls(rows):
        return sorted((r["op"], r["count"], r["shape"]) for r in rows)

    assert calls(rows) == calls(r for r in record if r["model"] == "builtin:cnn")


@pytest.mark.parametrize("path", PATHS)
def test_a_narrower_vector_path_gives_the_widest_paths_bits(kernels, monkeypatch, path):
    widest = _path_results(kernels, monkeypatch, None)
    assert _path_results(kernels, monkeypatch, path) == widest


@pytest.mark.skipif(
    not HAS_AVX512,
    reason="this CPU has no AVX-512: the kernel's "
    "widest path is AVX2, compared with the scalar one above",
)
def test_the_avx512_path_runs_by_default_where_the_cpu_has_it(kernels, monkeypatch):
    """On an AVX-512 CPU the default path is the AVX-512 one.

    Its bits equal the AVX2 and scalar paths' (the test above), and each
    name the variable gives is the path that runs.
    """
    assert kernels.vector_path() == "avx512"
    monkeypatch.setenv(fixed_order.ISA_VARIABLE, "avx2")
    assert kernels.vector_path() == "avx2"
    monkeypatch.setenv(fixed_order.ISA_VARIABLE, "scalar")
    assert kernels.vector_path() == "scalar"


def fixed_order_digests():
    """benchmarks/fixed_order_digests.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        "fixed_order_digests", REPO / "benchmarks" / "fixed_order_digests.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernels_bits_are_every_architectures_recorded_ones(kernels):
    """The kernel's digests here equal those recorded on x86-64 and aarch64.

    The record's TensorFlow digests, taken beside them, differ between the
    architectures: the control (its ops follow each CPU's kernels).
    """
    digests = fixed_order_digests()
    record = digests.recorded()
    assert {"x86_64", "aarch64"} <= set(record), record
    found = digests.digests()
    for architecture, entry in record.items():
        assert entry["digests"]["kernel"] == found["kernel"], architecture
    controls = [entry["digests"]["tensorflow"] for entry in record.values()]
    for op in ("matmul", "conv2d"):
        assert len({control[op] for control in controls}) > 1, (op, controls)


def test_a_missing_compiler_is_said_once_and_load_gives_none(
    monkeypatch, caplog, tmp_path
):
    monkeypatch.setattr(kernel_library, "compiler", lambda: None)
    # An empty cache: a cached build would load without a compiler.
    monkeypatch.setenv(kernel_library.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setattr(fixed_order.LIBRARY, "_state", {})
    with caplog.at_level("WARNING", logger="tfdet"):
        assert fixed_order.load() is None
        assert fixed_order.load() is None
    warnings = [
        r for r in caplog.records if "fixed_order_products.cc" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert "no C++ compiler" in warnings[0].getMessage()
    assert "use the slower pool-size-free composition instead, with other bits" in (
        warnings[0].getMessage()
    )


# One process per setting (pool size, oneDNN ISA cap): the kernel's and
# TensorFlow's bits on the same inputs, forward and both gradients, of a
# product and of a convolution, and the rows of a 96-row product (the images
# of a 16-image convolution) computed in smaller batches.
PRODUCTS = """
import hashlib, json, sys
import numpy as np
import tfdet
# TensorFlow's own products for the controls (the default's are the kernel's).
tfdet.enable(seed=0, threads=int(sys.argv[1]), cpu_isa=sys.argv[2],
             patches=sys.argv[3].split(","))
import tensorflow as tf
from tfdet._kernels import fixed_order as kernels

def digest(tensors):
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(np.ascontiguousarray(tensor).tobytes())
    return sha.hexdigest()[:16]

rng = np.random.default_rng(0)
# 256 x 4096 x 64 multiply-adds: enough for the kernel to cut its tiles for
# up to 8 threads (it keeps 8M a thread), and for each gradient too.
a = tf.constant(rng.normal(size=(256, 4096)), tf.float32)
b = tf.constant(rng.normal(size=(4096, 64)), tf.float32)
upstream = tf.constant(rng.normal(size=(256, 64)), tf.float32)
x = tf.constant(rng.normal(size=(96, 256)), tf.float32)
w = tf.constant(rng.normal(size=(256, 64)), tf.float32)
found = {}
for name, product in (("kernel", kernels.matmul), ("tf", tf.matmul)):
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        c = product(a, b)
    pool = digest([c, *tape.gradient(c, [a, b], output_gradients=upstream)])
    whole = product(x, w).numpy()
    rows = {
        batch: int(np.sum(np.any(product(x[:batch], w).numpy() != whole[:batch], 1)))
        for batch in (1, 5, 32)
    }
    found[name] = {"pool": pool, "rows": rows}

# Two convolutions, forward and both gradients: 8 channels (whose filter
# gradient oneDNN splits by the pool), and a strided one of 32 channels
# (which the kernel reads in place); and each image of the first computed
# in batches of 1 and 5.
images = tf.constant(rng.normal(size=(64, 32, 32, 8)), tf.float32)
w = tf.constant(rng.normal(size=(3, 3, 8, 8)), tf.float32)
upstream = tf.constant(rng.normal(size=(64, 32, 32, 8)), tf.float32)
wide = tf.constant(rng.normal(size=(16, 16, 16, 32)), tf.float32)
wide_w = tf.constant(rng.normal(size=(3, 3, 32, 64)), tf.float32)
wide_upstream = tf.constant(rng.normal(size=(16, 8, 8, 64)), tf.float32)
convolutions = (
    ("kernel", kernels.conv2d),
    ("tf", lambda x, w, **a: tf.raw_ops.Conv2D(input=x, filter=w, **a)),
)
for name, convolve in convolutions:
    tensors = []
    for x, kernel, dy, stride in ((images, w, upstream, 1),
                                  (wide, wide_w, wide_upstream, 2)):
        attributes = {"strides": [1, stride, stride, 1], "padding": "SAME"}
        with tf.GradientTape() as tape:
            tape.watch([x, kernel])
            y = convolve(x, kernel, **attributes)
        tensors += [y, *tape.gradient(y, [x, kernel], output_gradients=dy)]
    whole = tensors[0].numpy()
    differ = {
        batch: int(np.sum(np.any(
            convolve(images[:batch], w, strides=[1, 1, 1, 1], padding="SAME").numpy()
            != whole[:batch], (1, 2, 3))))
        for batch in (1, 5)
    }
    found[name].update(conv_pool=digest(tensors), conv_images=differ)

# A depthwise convolution's filter gradient (32 channels at 48x48, whose
# TensorFlow kernel, oneDNN's, splits the images by the pool), by the
# kernel and by TensorFlow's op.
from tensorflow.python.ops import gen_nn_ops
x = tf.constant(rng.normal(size=(64, 48, 48, 32)), tf.float32)
dy = tf.constant(rng.normal(size=(64, 48, 48, 32)), tf.float32)
for name, gradient in (("kernel", kernels.depthwise_conv2d_backprop_filter),
                       ("tf", gen_nn_ops.depthwise_conv2d_native_backprop_filter)):
    found[name]["depthwise_pool"] = digest(
        [gradient(x, [3, 3, 32, 1], dy, strides=[1, 1, 1, 1], padding="SAME")])
print(json.dumps(found))
"""

# (threads, oneDNN ISA cap): the pool sizes under enable()'s AVX2 cap (6 and
# 8 beyond this machine's cores: the kernel cuts its tiles by the pool
# size, about two a thread, and at 4, 6 and 8 the 256 x 4096 x 64
# product's tiles are the least-cost ones, 66 x 64, 48 x 64 and 66 x 32,
# where the first cut would leave threads idle), and one pool under SSE4.1 (oneDNN's narrower
# vectors, the control for width; the kernel on its scalar path there) and,
# where the CPU has it, under AVX-512 (oneDNN's and the kernel's widest).
POOLS = (1, 2, 3, 4, 6, 8)
SETTINGS = (
    *((threads, "AVX2") for threads in POOLS),
    (1, "SSE41"),
    *([(1, "AVX512_CORE")] if HAS_AVX512 else []),
)
KERNEL_PATH = {"SSE41": "scalar"}


@pytest.mark.slow
def test_bits_follow_neither_pool_nor_batch_where_tensorflows_ops_do(kernels):
    processes = {
        setting: subprocess.Popen(
            [
                sys.executable,
                "-c",
                PRODUCTS,
                str(setting[0]),
                setting[1],
                TENSORFLOW_PRODUCTS,
            ],  # fmt: skip
            env=clean_env(**{fixed_order.ISA_VARIABLE: KERNEL_PATH.get(setting[1])}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for setting in SETTINGS
    }
    results = {}
    for setting, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[setting] = last_json_line(out)
    kernel = {s: r["kernel"]["pool"] for s, r in results.items()}
    tf_matmul = {s: r["tf"]["pool"] for s, r in results.items()}
    # One digest for every pool size and both ISA caps.
    assert len(set(kernel.values())) == 1, kernel
    # The controls: TensorFlow's product follows the pool size, and the cap.
    pools = [tf_matmul[(threads, "AVX2")] for threads in POOLS]
    assert len(set(pools)) > 1, tf_matmul
    assert tf_matmul[(1, "SSE41")] != tf_matmul[(1, "AVX2")], tf_matmul
    if HAS_AVX512:
        assert tf_matmul[(1, "AVX512_CORE")] != tf_matmul[(1, "AVX2")], tf_matmul
    for setting, result in results.items():
        assert set(result["kernel"]["rows"].values()) == {0}, (setting, result)
        assert set(result["kernel"]["conv_images"].values()) == {0}, (setting, result)
    # Control: some row of TensorFlow's product follows its batch.
    assert any(sum(result["tf"]["rows"].values()) for result in results.values()), (
        results
    )
    # The convolution: one digest everywhere; TensorFlow's follows the pool
    # (its filter gradient) and the cap, and an image follows its batch.
    kernel = {s: r["kernel"]["conv_pool"] for s, r in results.items()}
    tf_conv = {s: r["tf"]["conv_pool"] for s, r in results.items()}
    assert len(set(kernel.values())) == 1, kernel
    assert len({tf_conv[(threads, "AVX2")] for threads in POOLS}) > 1, tf_conv
    # (oneDNN's convolutions here gave the AVX2 cap's bits under AVX-512 on a
    # Zen 5: the width's control is the product's, above.)
    assert tf_conv[(1, "SSE41")] != tf_conv[(1, "AVX2")], tf_conv
    # The depthwise filter gradient: one digest; TensorFlow's follows the pool.
    kernel = {s: r["kernel"]["depthwise_pool"] for s, r in results.items()}
    tf_depthwise = {s: r["tf"]["depthwise_pool"] for s, r in results.items()}
    assert len(set(kernel.values())) == 1, kernel
    assert len({tf_depthwise[(t, "AVX2")] for t in POOLS}) > 1, tf_depthwise
    assert any(sum(r["tf"]["conv_images"].values()) for r in results.values()), results
