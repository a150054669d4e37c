"""train_on_batch steps on a model compiled with jit_compile=True.

The model is `xla_models.jit_max_pool_3d`: MaxPooling3D has no deterministic
XLA gradient under tfdet, so under tfdet.enable() Keras turns XLA off and
tfdet reports it.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from xla_models import jit_max_pool_3d  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((6, 4, 4, 4, 1)).astype("float32")
y = rng.standard_normal((6, 2)).astype("float32")
model = jit_max_pool_3d()
for step in range(3):
    model.train_on_batch(x[2 * step : 2 * step + 2], y[2 * step : 2 * step + 2])
