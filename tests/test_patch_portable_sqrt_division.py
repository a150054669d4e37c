"""`portable_sqrt_division`: `x / sqrt(y)` in a tf.function stays exact.

Grappler rewrites the division into a multiplication by the approximate
`Rsqrt` (RSQRTPS, CPU-model dependent). The control: the same function
without the patch gives other bits than IEEE `x / sqrt(y)`.
"""

from __future__ import annotations

import pytest

from tests.conftest import clean_env, last_json_line, run_python

CODE = """
import json, sys
import numpy as np
import tfdet
from tfdet._patching import _registry
# fixed_order_add_n turns Grappler's arithmetic optimizer off too: the
# control leaves both out.
patches = "auto" if sys.argv[1] == "patched" else [
    "auto", "-portable_sqrt_division", "-fixed_order_add_n"
]
tfdet.enable(seed=1, patches=patches)
import tensorflow as tf
rng = np.random.default_rng(0)
x = rng.standard_normal(20000).astype(np.float32)
y = rng.random(20000).astype(np.float32) + np.float32(1e-3)

@tf.function
def scaled(x, y):
    return x / tf.sqrt(y + 1e-7)

exact = x / np.sqrt(y + np.float32(1e-7))
got = scaled(tf.constant(x), tf.constant(y)).numpy()
print(json.dumps({"differ": int((got != exact).sum())}))
"""


@pytest.mark.parametrize(("mode", "exact"), [("patched", True), ("unpatched", False)])
def test_division_by_a_square_root_is_exact_only_with_the_patch(mode, exact):
    result = run_python(
        "import sys; sys.argv[1:] = [" + repr(mode) + "]\n" + CODE, env=clean_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    differ = last_json_line(result.stdout)["differ"]
    assert (differ == 0) is exact, differ
