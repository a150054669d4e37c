"""Speed of tfdet's fixed-order convolutions against TensorFlow's Conv2D.

The built-in CNN's four convolutions (3x3 filters), or with `--layers
resnet50` nine of the zoo's ResNet-50's (64x64 images: 1x1 and 3x3 filters,
stride 2 where the model has it), or with `--layers first` the first
layers of the CNN, the zoo's MobileNetV2 and ResNet-50 (3 channels: few
weights, many positions), or with `--layers pointwise` the zoo's
MobileNetV2's 1x1 projections (few filters, many channels), at batch
`--batch`, each as forward,
input gradient and filter gradient: ms per call (median of
`--repeats` after one warm-up call; with `--fastest` the fastest of them,
which a shared machine's load moves less) of tfdet's kernel and of TensorFlow's op
in one process, alternately, each in a `tf.function`, at `--threads`
threads. TensorFlow's ops run with oneDNN on (`TF_ENABLE_ONEDNN_OPTS=1`, as
tfdet's profile pins it); no other tfdet setting. The kernel is built (or
found in the cache) first.

    python benchmarks/fixed_order_convolutions.py [--batch 64] [--threads 2]
        [--repeats 10] [--fastest]
    python benchmarks/fixed_order_convolutions.py --layers resnet50
    python benchmarks/fixed_order_convolutions.py --layers first
    python benchmarks/fixed_order_convolutions.py --layers pointwise
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# (input height, width, channels), filter size, filters, stride, padding.
LAYERS = {
    "cnn": (  # builtin:cnn's layers
        ((32, 32, 3), 3, 32, 1, "SAME"),
        ((32, 32, 32), 3, 32, 1, "VALID"),
        ((15, 15, 32), 3, 64, 1, "SAME"),
        ((15, 15, 64), 3, 64, 1, "VALID"),
    ),
    "resnet50": (  # benchmarks/zoo.py:resnet50's, one or two per stage
        ((16, 16, 64), 1, 64, 1, "SAME"),
        ((16, 16, 64), 3, 64, 1, "SAME"),
        ((16, 16, 64), 1, 256, 1, "SAME"),
        ((8, 8, 128), 3, 128, 1, "SAME"),
        ((4, 4, 256), 3, 256, 1, "SAME"),
        ((4, 4, 1024), 1, 256, 1, "SAME"),
        ((4, 4, 1024), 1, 2048, 2, "SAME"),
        ((2, 2, 512), 3, 512, 1, "SAME"),
        ((2, 2, 512), 1, 2048, 1, "SAME"),
    ),
    "first": (  # first layers: builtin:cnn's, the zoo's MobileNetV2's, ResNet-50's
        ((32, 32, 3), 3, 32, 1, "SAME"),
        ((96, 96, 3), 3, 32, 2, "SAME"),
        ((64, 64, 3), 7, 64, 2, "SAME"),
    ),
    "pointwise": (  # the zoo's MobileNetV2's 1x1 projections
        ((48, 48, 96), 1, 24, 1, "SAME"),
        ((24, 24, 144), 1, 24, 1, "SAME"),
        ((12, 12, 192), 1, 32, 1, "SAME"),
        ((6, 6, 384), 1, 64, 1, "SAME"),
    ),
}


def _ms(function, argument, repeats: int, statistic=statistics.median) -> float:
    function(argument)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(argument)
        times.append(time.perf_counter() - start)
    return 1e3 * statistic(times)


def _layer_cells(
    kernels, tf, x, w, dy, attributes, repeats: int, statistic=statistics.median
) -> list[str]:
    """ "kernel / TensorFlow" ms for the forward and both gradients of a layer."""
    x_shape, w_shape = tf.shape(x), tf.shape(w)
    pairs = (
        (
            lambda x: kernels.conv2d(x, w, **attributes),
            lambda x: tf.raw_ops.Conv2D(input=x, filter=w, **attributes),
            x,
        ),
        (
            lambda dy: kernels.conv2d_backprop_input(x_shape, w, dy, **attributes),
            lambda dy: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=x_shape, filter=w, out_backprop=dy, **attributes
            ),
            dy,
        ),
        (
            lambda dy: kernels.conv2d_backprop_filter(x, w_shape, dy, **attributes),
            lambda dy: tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=w_shape, out_backprop=dy, **attributes
            ),
            dy,
        ),
    )
    cells = []
    for ours, theirs, argument in pairs:
        ours, theirs = tf.function(ours), tf.function(theirs)
        cells.append(
            f"{_ms(ours, argument, repeats, statistic):.2f} / "
            f"{_ms(theirs, argument, repeats, statistic):.2f}"
        )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--layers", choices=sorted(LAYERS), default="cnn")
    parser.add_argument(
        "--fastest", action="store_true", help="The fastest call, not the median."
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import numpy as np
    import tensorflow as tf

    from tfdet._kernels import fixed_order as kernels

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if kernels.load() is None:
        raise SystemExit("the kernel could not be built (see the warning above)")
    rng = np.random.default_rng(0)
    print("| layer | forward kernel / TF | input gradient | filter gradient |")
    print("|---|---|---|---|")
    for image, size, filters, stride, padding in LAYERS[args.layers]:
        x = tf.constant(rng.normal(size=(args.batch, *image)), tf.float32)
        w = tf.constant(rng.normal(size=(size, size, image[2], filters)), tf.float32)
        attributes = {"strides": [1, stride, stride, 1], "padding": padding}
        dy = tf.constant(
            rng.normal(size=tf.raw_ops.Conv2D(input=x, filter=w, **attributes).shape),
            tf.float32,
        )
        statistic = min if args.fastest else statistics.median
        cells = _layer_cells(kernels, tf, x, w, dy, attributes, args.repeats, statistic)
        name = f"{image[0]}x{image[1]}x{image[2]} -> {filters}, {size}x{size}"
        name += f"/{stride}" if stride > 1 else ""
        name += f", {padding}"
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
