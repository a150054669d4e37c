"""Imports TensorFlow without the garbage collector walking it.

Importing TensorFlow and Keras makes about 270,000 objects that live as long
as the process: modules, functions, op definitions. While they are being
made, CPython's collector runs its full pass about five times, and each pass
walks every object then alive (0.25 s a pass once TensorFlow is in, on a
2-core EPYC Zen 3); later full passes during training walk them again. Those
objects are never garbage, so `enable()` imports with the collector paused
and then moves what exists into the permanent generation (`gc.freeze()`, the
pattern CPython documents for long-lived start-up state). Measured on that
machine (`benchmarks/startup.py`: enable() and a small Keras fit, ending
without the interpreter's teardown as tfdet's children do): the collector's
passes took 1.0-1.2 s of such a process, 0.03 s after; the process 6.4-7.3 s
instead of 6.6-8.1 s. A process that exits the normal way saves more, as its
final collection walks those objects too (5.4-6.4 s instead of 7.5-9.0 s).
The cost: about 1.5 MB more memory (what import left as cyclic garbage, kept).

Garbage collection decides no bits: it frees memory, and TensorFlow's
results do not follow where an object lives.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_then_frozen() -> Iterator[None]:
    """Pauses the collector for the block, then freezes what exists.

    A collector the program had turned off stays off.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
