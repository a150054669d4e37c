"""`xla_max_pool_grad`: a MaxPool gradient that XLA compiles deterministically.

On the CPU: the replacement equals TensorFlow's MaxPoolGrad kernel (exactly
without overlapping windows, within rounding with them), eagerly and
compiled with XLA; inside an XLA-compiled function the installed patch keeps
MaxPoolGrad (XLA's SelectAndScatter) out of the graph, and outside XLA it
leaves TensorFlow's gradient, and so the bits, unchanged. That the compiled
gradient is repeatable on a GPU under `--xla_gpu_deterministic_ops` needs a
GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.ops import gen_nn_ops  # noqa: E402

from tests.conftest import last_json_line, run_python  # noqa: E402
from tests.targets.xla_models import MAX_POOL_XLA_GRADIENT  # noqa: E402
from tfdet._patching import _registry  # noqa: E402
from tfdet.patches import xla_max_pool_grad  # noqa: E402

CASES = [
    # (height, width, kernel, strides, padding): overlapping windows when a
    # stride is below the kernel.
    (8, 8, (2, 2), (2, 2), "VALID"),
    (7, 9, (3, 3), (2, 2), "SAME"),
    (5, 6, (2, 3), (1, 1), "VALID"),
    (9, 4, (3, 2), (3, 1), "SAME"),
    (4, 4, (1, 1), (2, 2), "VALID"),
]


def _pool(case, seed: int = 0):
    height, width, kernel, strides, padding = case
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((2, height, width, 3)).astype(np.float32))
    y = tf.nn.max_pool2d(x, kernel, strides, padding)
    g = tf.constant(rng.standard_normal(y.shape).astype(np.float32))
    attrs = ([1, *kernel, 1], [1, *strides, 1], padding)
    return x, y, g, attrs


@pytest.mark.parametrize("case", CASES)
def test_equals_the_kernel_eagerly_and_under_xla(case) -> None:
    x, y, g, attrs = _pool(case)
    expected = gen_nn_ops.max_pool_grad(x, y, g, *attrs).numpy()
    received = xla_max_pool_grad.max_pool_grad(x, y, g, *attrs).numpy()
    compiled = tf.function(
        lambda x, y, g: xla_max_pool_grad.max_pool_grad(x, y, g, *attrs),
        jit_compile=True,
    )(x, y, g).numpy()
    assert received.shape == expected.shape == x.shape
    _, _, kernel, strides, _ = case
    overlapping = any(s < k for s, k in zip(strides, kernel, strict=True))
    for result in (received, compiled):
        if overlapping:  # An input that tops several windows sums them.
            np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(result, expected)


def test_ties_go_to_the_first_maximum_as_in_the_kernel() -> None:
    x = tf.ones([1, 4, 4, 1])
    y = tf.nn.max_pool2d(x, 2, 2, "VALID")
    g = tf.constant([[[[1.0], [2.0]], [[3.0], [4.0]]]])
    attrs = ([1, 2, 2, 1], [1, 2, 2, 1], "VALID")
    np.testing.assert_array_equal(
        xla_max_pool_grad.max_pool_grad(x, y, g, *attrs),
        gen_nn_ops.max_pool_grad(x, y, g, *attrs),
    )


@pytest.fixture
def installed():
    patch = _registry.available()["xla_max_pool_grad"]
    was_installed = patch.installed
    patch.install()
    yield patch
    if not was_installed:
        patch.restore()


def _gradient_op_types(jit_compile: bool) -> set[str]:
    x, _, _, _ = _pool(CASES[1])

    @tf.function(jit_compile=jit_compile)
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.max_pool2d(x, 3, 2, "SAME") ** 2)
        return tape.gradient(loss, x)

    graph = gradient.get_concrete_function(x).graph
    return {op.type for op in graph.get_operations()}


def test_installed_patch_keeps_max_pool_grad_out_of_xla_only(installed) -> None:
    assert "MaxPoolGrad" not in _gradient_op_types(jit_compile=True)
    # Outside XLA, TensorFlow's own gradient: the bits do not change.
    assert "MaxPoolGrad" in _gradient_op_types(jit_compile=False)


def test_without_the_patch_xla_gets_max_pool_grad() -> None:
    patch = _registry.available()["xla_max_pool_grad"]
    if patch.installed:
        pytest.skip("installed in this process by an earlier enable()")
    assert "MaxPoolGrad" in _gradient_op_types(jit_compile=True)


def test_compiled_training_gradient_equals_the_kernel(installed) -> None:
    x, _, _, _ = _pool(CASES[1], seed=3)

    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.max_pool2d(x, 3, 2, "SAME") ** 2)
        return tape.gradient(loss, x)

    compiled = tf.function(gradient, jit_compile=True)(x).numpy()
    plain = tf.function(gradient)(x).numpy()  # MaxPoolGrad, as before.
    np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-6)


def _max_pool_xla_on_cpu(patches) -> dict:
    code = MAX_POOL_XLA_GRADIENT.replace("PATCHES", repr(patches)).replace(
        "DEVICE", repr("/CPU:0")
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)


def test_the_gpu_tests_gradient_script_is_refused_unpatched_and_runs_patched() -> None:
    # tests/test_gpu.py runs this script on a GPU. TensorFlow's XLA bridge
    # refuses MaxPoolGrad under op determinism on every device, so the CPU
    # shows both arms. (The script once computed its loss outside the tape:
    # the gradient was None, and the refusal arm passed for that reason.)
    refused = _max_pool_xla_on_cpu(None)
    assert refused.get("error") == "UnimplementedError", refused
    assert "deterministic XLA implementation" in refused["message"]
    assert "bits" in _max_pool_xla_on_cpu("auto")
