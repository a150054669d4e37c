"""`strided_pointwise_filter_grad`: a correct kernel gradient where oneDNN's is not.

oneDNN's AVX2 backward-by-weights of a strided 1x1 convolution on fewer than
8 input channels writes past its workspace: a wrong gradient with two
threads, a corrupted heap (the process aborts) with one. tfdet's profile
caps oneDNN at AVX2, so every `tfdet.enable()` reached it. Each case runs a
Keras `Conv2D(8, 1, strides=2)` on 3-channel 8x8 images in a fresh process
and compares the kernel's gradient with NumPy's float64 sum, 10 times.
"""

from __future__ import annotations

import pytest

from tests.conftest import clean_env, last_json_line, run_python
from tfdet._patching import _registry

GRADIENT = """
import json
import numpy as np
threads, with_tfdet = THREADS, WITH_TFDET
if with_tfdet:
    import tfdet
    tfdet.enable(seed=0, threads=threads)
import tensorflow as tf
import keras
if not with_tfdet:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 8, 8, 3)).astype("float32")
layer = keras.layers.Conv2D(8, 1, strides=2, use_bias=False)
layer.build(x.shape)
# The overrun's damage depends on what lies past the workspace: one call
# can come out right, so the worst of 10 is kept.
error = 0.0
for _ in range(10):
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(y * y)
    (gradient,) = tape.gradient(loss, layer.trainable_weights)
    dy = 2.0 * np.asarray(y, "float64")
    exact = np.einsum("nijc,nijf->cf", x[:, ::2, ::2].astype("float64"), dy)
    error = max(error, float(np.max(np.abs(np.asarray(gradient)[0, 0] - exact))
                             / np.max(np.abs(exact))))
print(json.dumps({"error": error}))
"""


def _relative_error(threads: int, with_tfdet: bool) -> float | None:
    """The gradient's error, or None when the process died (heap corruption)."""
    env = clean_env()
    if not with_tfdet:
        # What the profile pins: oneDNN on (TensorFlow leaves it off by itself
        # on a CPU without AVX-512, such as an AVX2-only AMD EPYC Zen 3,
        # where the control would otherwise run Eigen's correct kernel) and
        # capped at AVX2.
        env["TF_ENABLE_ONEDNN_OPTS"] = "1"
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    result = run_python(
        f"THREADS, WITH_TFDET = {threads}, {with_tfdet}\n{GRADIENT}", env=env
    )
    if result.returncode != 0:
        assert result.returncode < 0 or "malloc" in result.stderr, result.stderr
        return None
    return last_json_line(result.stdout)["error"]


def _onednn_is_wrong() -> bool:
    """The control: TensorFlow's own kernel under the same cap is wrong, or
    its process dies (on 1 thread it usually aborts on the corrupted heap).

    What the overrun damages depends on what lies past the workspace and on
    how the pool shares the work out, and once, on a loaded machine, ten
    calls on 2 threads came out right: up to three processes, 2 threads,
    then 1, then 2 again.
    """
    for threads in (2, 1, 2):
        error = _relative_error(threads, with_tfdet=False)
        if error is None or error > 1e-2:
            return True
    return False


@pytest.mark.parametrize("threads", [1, 2])
def test_enable_gives_the_exact_gradient(threads):
    assert _relative_error(threads, with_tfdet=True) < 1e-6


def test_control_onednn_under_the_same_pins_is_wrong():
    assert _onednn_is_wrong()


def test_the_patch_is_installed_by_auto():
    assert "strided_pointwise_filter_grad" in _registry.resolve("auto")
