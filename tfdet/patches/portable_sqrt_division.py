"""`x / sqrt(y)` stays a division: the same bits on every CPU.

Inside a `tf.function`, Grappler's arithmetic optimizer rewrites
`x / sqrt(y)` into `x * rsqrt(y)` (its "SqrtDivToRsqrtMul" stage; `pow(y,
-0.5)` likewise becomes `rsqrt`). Eigen's float32 `Rsqrt` kernel starts from
the x86 approximate instruction RSQRTPS, whose last bits depend on the CPU
model, so the rewritten graph is not correctly rounded and not portable:
Keras 3's RMSprop (`lr * g / sqrt(v + eps)`) gave other weights under QEMU's
emulated Haswell than natively (docs/measurements.md). The rewrite
happens below Python, so `portable_rsqrt` cannot see it. This patch turns
the arithmetic optimizer off (`tf.config.optimizer.set_experimental_options`,
for functions traced from then on); other Grappler passes (constant folding,
remapping, layout) stay on. `restore()` turns it back on.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch

OPTION = "arithmetic_optimization"


class _ArithmeticOptimizer:
    """Grappler's arithmetic optimizer as one attribute a `Swap` can set."""

    @property
    def enabled(self) -> bool:
        import tensorflow as tf

        return tf.config.optimizer.get_experimental_options().get(OPTION, True)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({OPTION: value})


ARITHMETIC_OPTIMIZER = _ArithmeticOptimizer()


def _apply(swap: Any) -> None:
    swap.attribute(ARITHMETIC_OPTIMIZER, "enabled", False)


PATCH = Patch(
    summary="Grappler's x / sqrt(y) -> x * rsqrt(y) rewrite (RSQRTPS, CPU-model "
    "dependent) -> no rewrite: the arithmetic optimizer is off",
    upstream="https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/grappler/optimizers/arithmetic_optimizer.cc",
    apply=_apply,
    # Every TensorFlow tfdet supports rewrites the division (Grappler's
    # arithmetic optimizer has done so since TF 1.x).
    requires={"tensorflow": ">=2.16"},
)
