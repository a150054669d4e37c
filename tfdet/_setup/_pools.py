"""TensorFlow's two thread pools: their sizes under `tfdet.enable()`, and
the guard that keeps them.

The intra-op pool gets `threads`; the inter-op pool `threads` too where the
`fixed_order_add_n` patch sums AddN in its inputs' order, else one (the
schedule then repeats, see `INTER_OP_THREADS`). Once set, TensorFlow's own
setters refuse another size: the profile records the sizes, and with
TensorFlow's own products they decide the bits.
"""

from __future__ import annotations

import os
from typing import Any

from tfdet._errors import ProfileMismatchError, TooLateError
from tfdet.patches import fixed_order_add_n

# The inter-op pool's size, unless the patch below is installed. With two
# inter-op threads (2-core AMD EPYC Zen 5, TF 2.21), keras.applications.
# MobileNetV2's gradients of one batch gave other bits from call to call and
# from process to process, with oneDNN on or off: each BatchNormalization's
# input gradient is an `AddN` of three, and TensorFlow's AddN sums from the
# input whose buffer it may reuse, which depends on whether the other ops
# reading that input, side by side, have finished. With one inter-op thread
# the schedule repeats, and so do the bits; an op still runs on the intra-op
# pool's threads, only independent ops no longer run side by side.
INTER_OP_THREADS = 1

# The opt-in patch that folds AddN in input order: with it the schedule
# decides no bit (measured: 1 digest in 40 calls and in 6 processes where
# AddN gave 2-3 in 12), so the inter-op pool gets `threads` threads too.
SCHEDULE_FREE_PATCH = fixed_order_add_n.PATCH.name


def inter_op_threads(threads: int, patches: Any) -> int:
    """The inter-op pool's size for `threads` and the selected patch names."""
    return threads if SCHEDULE_FREE_PATCH in patches else INTER_OP_THREADS


def pin(threads: int, inter: int, started: bool) -> tuple[int, int]:
    import tensorflow as tf

    threading = tf.config.threading
    pinned = (threads, inter)
    current = (
        threading.get_intra_op_parallelism_threads(),
        threading.get_inter_op_parallelism_threads(),
    )
    if started and current != pinned:
        # Always an error, also with strict=False: the pools decide the bits.
        raise TooLateError(
            "threads",
            f"TensorFlow's thread pools were created with intra={current[0]}, "
            f"inter={current[1]} (0 means one per core) when the first op ran, "
            f"and cannot become intra={pinned[0]}, inter={pinned[1]}.",
        )
    threading.set_intra_op_parallelism_threads(pinned[0])
    threading.set_inter_op_parallelism_threads(pinned[1])
    _guard_setters(threading, *pinned)
    return pinned


def _guard_setters(threading: Any, intra: int, inter: int) -> None:
    """Makes TensorFlow's pool setters refuse another size than the pinned one.

    A script that calls `set_intra_op_parallelism_threads(4)` after
    `enable()` (before its first op) would otherwise train with 4 threads
    while the profile and every trace say 1: the bits follow the pool size.
    Setting the pinned size again stays a no-op.
    """
    for name, threads in (
        ("set_intra_op_parallelism_threads", intra),
        ("set_inter_op_parallelism_threads", inter),
    ):
        original = getattr(threading, name)
        if getattr(original, "_tfdet_pinned", None) is not None:
            original = original.__wrapped__

        def setter(
            num_threads: int,
            _original: Any = original,
            _name: str = name,
            _threads: int = threads,
        ) -> None:
            if num_threads != _threads:
                advice = (
                    "The pool size decides the bits and the profile records it: "
                    f"pass threads={num_threads!r} to enable() (or --threads "
                    f"{num_threads!r} to tfdet run / tfdet check --script) instead."
                    if _name == "set_intra_op_parallelism_threads"
                    else f"tfdet sizes the inter-op pool at {_threads}: at "
                    f"`threads` where the {SCHEDULE_FREE_PATCH!r} patch (in "
                    "the default) sums AddN in a fixed order, else at one, "
                    "since with more TensorFlow's AddN gives other bits from "
                    "run to run."
                )
                raise ProfileMismatchError(
                    f"Expected the thread pools tfdet.enable() pinned ({_threads}). "
                    f"Received: tf.config.threading.{_name}({num_threads!r}). "
                    + advice,
                    {"threads": (_threads, num_threads)},
                )
            _original(num_threads)

        setter.__wrapped__ = original  # type: ignore[attr-defined]
        setter._tfdet_pinned = threads  # type: ignore[attr-defined]
        setattr(threading, name, setter)


def threads_in_force(configured: int, variable: str) -> int:
    """The pool size: the API's setting, else the environment's (read by TF)."""
    if configured:
        return configured
    try:
        return max(0, int(os.environ.get(variable, "0")))
    except ValueError:
        return 0
