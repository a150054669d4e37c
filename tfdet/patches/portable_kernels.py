"""The portable functions as ops of tfdet's own: the same bits, faster.

`portable_erfc` makes `Erfc` (and with it the exact GELU, Keras 3's `gelu`)
portable as a composition of about 25 TensorFlow ops, one pass over the
data each. This patch computes that composition in one op of tfdet's own
(`TfdetPortableErfc`, `portable_functions.cc`), step for step, with the
same bits: every step is one correctly rounded float32 operation, and its
`exp(-x^2)` is TensorFlow's own Exp kernel's code (Eigen's functor over the
whole tensor on the op's thread pool, compiled for AVX as the TensorFlow
wheels are). So the weights, the digests and every tier stay what
`enable()` gives; only the time changes.

The library is installed with tfdet on x86-64 (compiled into its wheel,
one per TensorFlow minor), else compiled at first use against the installed
TensorFlow and cached (`tfdet._kernels`). Before its first
use in a process, its results are compared bit for bit with the
composition's on a fixed set of inputs (every kind of float32, the clamp's
edges, both branches, tensor lengths that end off a packet); where no
compiler builds it, or where they disagree, tfdet says so once and keeps the
composition.

A model exported while it is installed keeps to TensorFlow's own ops
(`export_without_kernels`: the exports trace the composition, with the same
bits), so the SavedModel loads and serves where tfdet is not installed.

Beside `pool_size_free_products`, whose element-wise functions run on
whole packets (an element's bits then do not follow its tensor's size, nor
the batch), the kernel runs its exp on whole packets too (`whole_packets`:
the tensor padded with zeros to a multiple of 16), so it keeps the bits of
the composition there, which the same check shows.

Installed by "auto"; it needs its library, installed with tfdet or built
at first use by a C++ compiler. Where `portable_erfc` is not
installed (TensorFlow before 2.20, whose Erfc needs no replacement), it
does nothing.
Cost: `benchmarks/portable_kernels.py`.
"""

from __future__ import annotations

import logging
import platform
from typing import Any

from tfdet._kernels import build, portable, portable_math
from tfdet._patching import _registry
from tfdet._patching._registry import Patch
from tfdet.patches import portable_erfc

_LOG = logging.getLogger("tfdet")

LIBRARY = portable.LIBRARY
# Whether the kernel gave the composition's bits on `probe_inputs()`, by
# whether its exp ran on whole packets: checked once a process for each, at
# the first use.
_verdict: dict[bool, bool] = {}


def probe_inputs() -> Any:
    """The float32 inputs the kernel must agree on before it is used: a sweep
    over the clamp's range and past it, the branches' edge (|x| = 1), zeros,
    infinities, NaN, subnormals and random bit patterns; 12 284 elements, so
    that the last ones take Eigen's scalar path."""
    import numpy as np

    special = np.array(
        [0.0, -0.0, 1.0, -1.0, 11.0, -11.0, np.inf, -np.inf, np.nan, 1e-38, -1e-45],
        dtype=np.float32,
    )
    # numpy's stubs type np.float32(x) for a scalar only; a list gives an array.
    edges = np.nextafter(
        np.float32([1.0, -1.0, 11.0, -11.0]),  # type: ignore[arg-type]
        np.float32([2.0, -2.0, 12.0, -12.0]),  # type: ignore[arg-type]
    )
    bits = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64)
    return np.concatenate(
        [
            np.linspace(-12.0, 12.0, 8173, dtype=np.float32),
            special,
            edges.astype(np.float32),
            bits.astype(np.uint32).view(np.float32),
        ]
    )


def _agrees(library: Any, whole_packets: bool) -> bool:
    """Whether the kernel gives the composition's bits on `probe_inputs()`
    (the composition's Exp on whole packets where `whole_packets`: the
    pool-size-free products have made it so)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    # Eagerly, also when first called while tracing: `init_scope` leaves a
    # tf.function's graph, but under a TF1 graph (`Graph.as_default()`, as
    # in tf.compat.v1 code and TensorFlow's own graph-mode tests) the
    # outermost context is that graph, whose tensors have no `numpy()`.
    with tf.init_scope(), context.eager_mode():
        x = tf.constant(probe_inputs())
        found = library.tfdet_portable_erfc(x, whole_packets=whole_packets)
        expected = portable_erfc.erfc_float32(x)
        found, expected = found.numpy(), expected.numpy()
    return bool(np.array_equal(found.view(np.uint32), expected.view(np.uint32)))


# Where this patch is installed, TensorFlow's Exp, and the kernel's exp
# like it, take Eigen's scalar path for a tensor's last `size % 8` elements,
# so an element's bits follow the tensor's size, and with it the batch; the
# pool-size-free products run Exp on whole packets (their any-batch
# promise), and beside them the kernel does too. (An exact GELU at batch 5
# of 96 rows of 1023 gave one row other bits with the kernel's scalar tail,
# none on whole packets; 2-core AMD EPYC Zen 5, TF 2.21.)
_WHOLE_PACKETS = "pool_size_free_products"


def _beside_whole_packets() -> bool:
    """Whether the composition's Exp runs on whole packets: the pool-size-free
    products are installed (see above), or the portable exp is (every
    element on the packet path), with its library loaded."""
    installed = _registry.installed()
    return _WHOLE_PACKETS in installed or (
        "portable_math" in installed and portable_math.LIBRARY.loaded()
    )


def erfc(x: Any) -> Any:
    """`portable_erfc.erfc_float32(x)` (float32) by the kernel, once it was
    found to agree with the composition in this process; else the
    composition."""
    library = LIBRARY.load()
    whole_packets = _beside_whole_packets()
    if library is not None and whole_packets not in _verdict:
        _verdict[whole_packets] = _agrees(library, whole_packets)
        if not _verdict[whole_packets]:
            _LOG.warning(
                "tfdet: the portable_kernels Erfc kernel gave other bits than the "
                "composition on its probe inputs; the composition is used."
            )
    if library is None or not _verdict[whole_packets]:
        return portable_erfc.erfc_float32(x)
    return library.tfdet_portable_erfc(x, whole_packets=whole_packets)


def _apply(swap: Any) -> None:
    if not portable_erfc.PATCH.installed:
        # Nothing to stand for: before TensorFlow 2.20 its own Erfc is
        # portable and enable() keeps it. Not loaded, so the profile's
        # `kernels` does not name a library no op uses (a machine without a
        # compiler would otherwise differ in its profile, not its bits).
        return
    # Built (or found in the cache) now, so the first step does not pay for
    # the compiler, and a missing compiler is said at enable().
    LIBRARY.load()
    swap.attribute(portable_erfc, "kernel", erfc)


def _nothing_to_compute() -> str | None:
    """Why the kernel has no op to compute here, or None."""
    if platform.machine() not in build.OWN_FLAGS[LIBRARY.name]:
        # Its exp is TensorFlow's x86-64 one; elsewhere the composition over
        # the portable exp (portable_math) is the portable Erfc.
        return f"the kernel is built for x86-64 only, not {platform.machine()}"
    if portable_erfc.PATCH.needed():
        return None
    return "TensorFlow's own Erfc is portable here (before 2.20): no composition to stand for"


PATCH = Patch(
    summary="PortableErfc's composition (about 25 ops) -> one op of tfdet's own "
    "with the same bits (the exact GELU at about the speed of TensorFlow's Erfc)",
    upstream=portable_erfc.PATCH.upstream,
    apply=_apply,
    unavailable=_nothing_to_compute,
    cpu_only=True,
    kernel=LIBRARY,
)
