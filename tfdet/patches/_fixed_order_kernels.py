"""tfdet's own matrix products, whose bits are fixed by the shapes alone.

The kernel (`_fixed_order_matmul.cc`, beside this module) sums every output
element's K terms in one chain of fused multiply-adds, k = 0 .. K-1, and
splits the work over output tiles only, so its bits do not follow the
thread count, the row count (a sample's batch) or the vector width (its
AVX2 path and its scalar path give the same bits). See the source's header.

It is a TensorFlow custom op compiled at first use against the installed
TensorFlow (`tf.sysconfig`'s flags, the C++ compiler `CXX` or `g++`), cached
per TensorFlow version and source under `TFDET_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/tfdet/kernels` (`~/.cache/tfdet/kernels`), built under a
file lock and moved into place atomically, so parallel processes build it
once. Where it cannot be built (no compiler, a failed build) `load()`
returns None and says why once: the caller falls back to a composition of
TensorFlow's ops. `pip install` never compiles anything.

`TFDET_FIXED_ORDER_ISA=scalar` makes the kernel use its scalar path on any
CPU (the tests compare both paths).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LOG = logging.getLogger("tfdet")

SOURCE = Path(__file__).with_name("_fixed_order_matmul.cc")
# Where the built library is kept (a directory); the tests share one build.
CACHE_VARIABLE = "TFDET_KERNEL_CACHE"
# "scalar" forces the scalar micro-kernel (read by the kernel at each call).
ISA_VARIABLE = "TFDET_FIXED_ORDER_ISA"
# Never -ffast-math: the kernel's chains are its bits. -ffp-contract=off
# keeps the compiler from fusing the code's own multiply-adds; the AVX2
# micro-kernel is compiled for AVX2+FMA by target attributes, chosen by
# CPUID at run time, so the rest runs on any x86-64.
_FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3", "-ffp-contract=off", "-w")

_loaded: dict[str, Any] = {}


def cache_dir() -> Path:
    """The directory that holds built kernels (created on build)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfdet" / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def library_path(compiler: str, flags: list[str]) -> Path:
    """The cached library for this TensorFlow, source, compiler and flags."""
    import tensorflow as tf

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join([compiler, *_FLAGS, *flags]).encode())
    return (
        cache_dir()
        / f"tf{tf.__version__}-{digest.hexdigest()[:16]}"
        / ("fixed_order_matmul.so")
    )


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build() -> Path:
    """Builds the library if it is not cached; returns its path.

    Raises:
        RuntimeError: no C++ compiler, or the build failed (with its output).
    """
    import tensorflow as tf

    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (set CXX or install g++)")
    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    target = library_path(compiler, flags)
    if target.exists():
        return target
    with _locked(target.parent):
        if target.exists():  # Another process built it while we waited.
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            command = [
                compiler,
                *_FLAGS,
                *tf.sysconfig.get_compile_flags(),
                str(SOURCE),
                "-o",
                str(built),
                *tf.sysconfig.get_link_flags(),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(
                    f"the build failed ({' '.join(command)}):\n{done.stderr[-2000:]}"
                )
            os.replace(built, target)
    return target


def load() -> Any:
    """The loaded op library, built first if needed; None where it cannot be.

    The first failure is logged once (tfdet's logger, a warning) with the
    reason; later calls return None at once.
    """
    if "library" in _loaded:
        return _loaded["library"]
    import tensorflow as tf

    try:
        library = tf.load_op_library(str(build()))
    except (RuntimeError, OSError, tf.errors.NotFoundError) as error:
        _LOG.warning(
            "tfdet: the fixed-order product kernel is unavailable (%s); "
            "products use the slower pool-size-free composition instead.",
            error,
        )
        library = None
    else:
        _register_gradients(tf)
    _loaded["library"] = library
    return library


def matmul(a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False) -> Any:
    """`a @ b` of 2-D float32 matrices by the kernel (which must load)."""
    return load().tfdet_fixed_order_mat_mul(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b
    )


def batch_matmul(x: Any, y: Any, adj_x: bool = False, adj_y: bool = False) -> Any:
    """`x @ y` over broadcast batch dimensions, by the kernel."""
    return load().tfdet_fixed_order_batch_mat_mul(x, y, adj_x=adj_x, adj_y=adj_y)


def _mat_mul_gradient(op: Any, grad: Any) -> tuple[Any, Any]:
    """MatMul's gradients, each again a fixed-order product.

    TensorFlow's own formulas (`math_grad._MatMulGrad`) with its products
    replaced: the transpose flags choose which operand is read transposed.
    """
    a, b = op.inputs
    t_a, t_b = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    if not t_a and not t_b:
        return matmul(grad, b, transpose_b=True), matmul(a, grad, transpose_a=True)
    if not t_a and t_b:
        return matmul(grad, b), matmul(grad, a, transpose_a=True)
    if t_a and not t_b:
        return matmul(b, grad, transpose_b=True), matmul(a, grad)
    return (
        matmul(b, grad, transpose_a=True, transpose_b=True),
        matmul(grad, a, transpose_a=True, transpose_b=True),
    )


def _batch_mat_mul_gradient(op: Any, grad: Any) -> tuple[Any, Any]:
    """BatchMatMulV2's gradients (`math_grad._BatchMatMulV2Grad`'s formulas).

    The gradient of a broadcast operand is summed over the batch axes it
    was broadcast along: a `Sum` over those axes, which splits only over
    its outputs.
    """
    import tensorflow as tf

    x, y = op.inputs
    adj_x, adj_y = op.get_attr("adj_x"), op.get_attr("adj_y")
    if not adj_x and not adj_y:
        gx, gy = batch_matmul(grad, y, adj_y=True), batch_matmul(x, grad, adj_x=True)
    elif not adj_x and adj_y:
        gx, gy = batch_matmul(grad, y), batch_matmul(grad, x, adj_x=True)
    elif adj_x and not adj_y:
        gx, gy = batch_matmul(y, grad, adj_y=True), batch_matmul(x, grad)
    else:
        gx = batch_matmul(y, grad, adj_x=True, adj_y=True)
        gy = batch_matmul(grad, x, adj_x=True, adj_y=True)
    shape_x, shape_y = tf.shape(x), tf.shape(y)
    axes_x, axes_y = tf.raw_ops.BroadcastGradientArgs(s0=shape_x[:-2], s1=shape_y[:-2])
    gx = tf.reshape(tf.reduce_sum(gx, axes_x), shape_x)
    gy = tf.reshape(tf.reduce_sum(gy, axes_y), shape_y)
    return gx, gy


def _register_gradients(tf: Any) -> None:
    """Registers the ops' gradients (once a process: TensorFlow refuses two)."""
    tf.RegisterGradient("TfdetFixedOrderMatMul")(_mat_mul_gradient)
    tf.RegisterGradient("TfdetFixedOrderBatchMatMul")(_batch_mat_mul_gradient)
