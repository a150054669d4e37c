"""The portable math library's bits on this architecture, against the record.

One process (one thread for TensorFlow's ops): each function of
`TfdetPortableUnary` (exp, log, log1p, expm1, tanh, sigmoid, sin, cos), `Pow`
(a number and a tensor exponent) and `TfdetFixedOrderSum` (rows, columns, a
long vector, a mean), each with its gradient, computed by tfdet's library
and by TensorFlow's own ops (the control) from one seeded input set of 4,099
elements a function (a length off the packet widths, so the last elements
take Eigen's scalar path in TensorFlow's ops); a sha256 digest (16 hex
digits) of each. The library runs Eigen's packet algorithms with unfused
multiply-adds on every element on both architectures, so its digests are
the same on x86-64 and aarch64; TensorFlow's follow the architecture.
Beside them, `model`: a Dense-softmax model trained with the categorical
cross-entropy in a fresh process under `tfdet.enable()` (the "kernel"
digest) and with the patches that call the library left out (its control).

    python benchmarks/portable_math_digests.py            # print, compare
    python benchmarks/portable_math_digests.py --record   # and keep them

The record is `benchmarks/portable_math_digests.json`, one entry per
architecture.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Its sibling, for the record's command line (loaded by path in the tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixed_order_digests  # noqa: E402

RECORD = Path(__file__).with_name("portable_math_digests.json")
FUNCTIONS = ("exp", "log", "log1p", "expm1", "tanh", "sigmoid", "sin", "cos")
# The sums: (shape of the [outer, n, inner] view, mean).
SUMS = {
    "rows": ((64, 1000, 1), False),
    "columns": ((1, 3000, 48), False),
    "vector": ((1, 40000, 1), False),
    "mean": ((8, 500, 16), True),
}


# One model trained under the default, in a fresh process: a Dense layer, a
# softmax and the categorical cross-entropy (exp, log and the sums, forward
# and backward). Its control leaves out the patches that put the functions
# and sums on the library, the ones the architecture decides without them.
MODEL = "categorical_crossentropy"
ARCHITECTURE_PATCHES = (
    "portable_math",
    "fixed_order_sums",
    "portable_log_softmax",
    "portable_orthogonal",
)
TRAIN = """
import hashlib, importlib.util, json, sys
import tfdet
tfdet.enable(seed=0, patches=json.loads(sys.argv[3]))
import numpy as np
spec = importlib.util.spec_from_file_location("survey_models", sys.argv[1])
survey = importlib.util.module_from_spec(spec)
spec.loader.exec_module(survey)
model, x, y = getattr(survey, sys.argv[2])()
model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
sha = hashlib.sha256()
for weight in model.get_weights():
    sha.update(np.ascontiguousarray(weight).tobytes())
print(json.dumps(sha.hexdigest()[:16]))
"""


def model_digest(patches: list[str]) -> str:
    """The weights' digest of `MODEL` trained under `enable(patches=...)` in
    a fresh process of this Python, which imports the tfdet this one did."""
    import json
    import os
    import subprocess

    import tfdet

    env = {**os.environ, "PYTHONPATH": str(Path(tfdet.__file__).parents[1])}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    survey = Path(__file__).with_name("survey_models.py")
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, str(survey), MODEL, json.dumps(patches)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{MODEL} did not train:\n{done.stderr[-3000:]}")
    return str(json.loads(done.stdout.strip().splitlines()[-1]))


def _inputs(function: str) -> Any:
    """4,099 inputs the function is defined on, from its own seed."""
    import numpy as np

    rng = np.random.default_rng(sum(map(ord, function)))
    x = rng.normal(size=4099) * (8.0 if function in ("sin", "cos", "exp") else 3.0)
    if function in ("log", "log1p"):
        x = np.abs(x) + (0.0 if function == "log1p" else 1e-3)
    return x.astype(np.float32)


def _with_gradient(compute: Any, *inputs: Any) -> list[Any]:
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(list(inputs))
        result = compute(*inputs)
    upstream = tf.ones_like(result) * 0.75
    return [result, *tape.gradient(result, list(inputs), output_gradients=upstream)]


def digests() -> dict[str, dict[str, str]]:
    """{"kernel" | "tensorflow": {name: digest}} for each function and sum,
    and for a model trained under the default ("kernel") and without the
    patches that call the library ("tensorflow").

    Raises:
        RuntimeError: the library cannot be had here.
    """
    import numpy as np
    import tensorflow as tf

    from tfdet._kernels import portable_math

    library = portable_math.LIBRARY.load()
    if library is None:
        raise RuntimeError("the portable math library cannot be built here")
    raw = {
        "exp": tf.raw_ops.Exp, "log": tf.raw_ops.Log, "log1p": tf.raw_ops.Log1p,
        "expm1": tf.raw_ops.Expm1, "tanh": tf.raw_ops.Tanh,
        "sigmoid": tf.raw_ops.Sigmoid, "sin": tf.raw_ops.Sin, "cos": tf.raw_ops.Cos,
    }  # fmt: skip
    found: dict[str, dict[str, str]] = {"kernel": {}, "tensorflow": {}}
    for function in FUNCTIONS:
        x = tf.constant(_inputs(function))
        found["kernel"][function] = fixed_order_digests._digest(
            _with_gradient(
                lambda v, f=function: library.tfdet_portable_unary(v, function=f), x
            )
        )
        found["tensorflow"][function] = fixed_order_digests._digest(
            _with_gradient(lambda v, f=function: raw[f](x=v), x)
        )
    base = tf.constant(np.abs(_inputs("pow")) + 0.01)
    exponent = tf.constant(_inputs("exponent") / 3.0)
    for name, y in (("pow", tf.constant(np.float32(2.5))), ("pow_tensor", exponent)):
        found["kernel"][name] = fixed_order_digests._digest(
            _with_gradient(library.tfdet_portable_pow, base, y)
        )
        found["tensorflow"][name] = fixed_order_digests._digest(
            _with_gradient(lambda b, e: tf.raw_ops.Pow(x=b, y=e), base, y)
        )
    rng = np.random.default_rng(1)
    for name, (shape, mean) in SUMS.items():
        x = tf.constant(rng.normal(size=shape).astype(np.float32))
        found["kernel"][name] = fixed_order_digests._digest(
            _with_gradient(
                lambda v, m=mean: library.tfdet_fixed_order_sum(v, 1, mean=m), x
            )
        )
        op = tf.raw_ops.Mean if mean else tf.raw_ops.Sum
        found["tensorflow"][name] = fixed_order_digests._digest(
            _with_gradient(lambda v, op=op: op(input=v, axis=1), x)
        )
    found["kernel"]["model"] = model_digest(["auto"])
    without = ["auto", *(f"-{name}" for name in ARCHITECTURE_PATCHES)]
    found["tensorflow"]["model"] = model_digest(without)
    return found


def recorded() -> dict[str, Any]:
    """The record: {architecture: {"machine", "tensorflow", "digests"}}."""
    return fixed_order_digests.recorded(RECORD)


if __name__ == "__main__":
    fixed_order_digests.run(__doc__.splitlines()[0], RECORD, digests, "library")
