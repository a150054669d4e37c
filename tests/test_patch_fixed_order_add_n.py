"""`fixed_order_add_n`: an `AddN` of three or more sums in its inputs' order.

TensorFlow's `AddN` moves the input whose buffer it reuses to the front of
its sum, so the same inputs give other bits when another op still holds a
buffer: the control runs the same function without the patch and shows
both sums. Each case runs in a fresh process (the patch binds TensorFlow's
modules process-wide).
"""

from __future__ import annotations

import pytest

from tests.conftest import run_json

CODE = """
import json, sys
import tfdet
patches = ["auto"] if sys.argv[1] == "patched" else ["auto", "-fixed_order_add_n"]
tfdet.enable(seed=1, patches=patches)
import numpy as np
import tensorflow as tf

# (a + b) + c is 0 in float32 (1 + 1e8 rounds to 1e8); (c + b) + a is 1.
a, b, d, one = (tf.constant([v] * 16) for v in (1.0, 1e8, -1e8, 1.0))

@tf.function
def reusable(a, b, d, one):
    c = d * one  # only AddN reads it: its buffer may hold the sum
    return tf.math.add_n([a, b, c])

@tf.function
def held(a, b, d, one):
    c = d * one
    return tf.math.add_n([a, b, c]), c  # returned too: its buffer is not free

x = tf.constant([[1.0, 2.0]])

@tf.function
def gradient(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(tf.sin(x) + tf.cos(x) + tf.exp(x))  # x read thrice
    return tape.gradient(y, x)

def widest_add_n(function, *args):
    graph = function.get_concrete_function(*args).graph
    return max(
        [len(op.inputs) for op in graph.get_operations() if op.type == "AddN"],
        default=0,
    )

print(json.dumps({
    "reusable": float(reusable(a, b, d, one).numpy()[0]),
    "held": float(held(a, b, d, one)[0].numpy()[0]),
    "widest_add_n": widest_add_n(reusable, a, b, d, one),
    "gradient_add_n": widest_add_n(gradient, x),
    "gradient": gradient(x).numpy()[0].tolist(),
    "expected_gradient": (np.cos([1.0, 2.0]) - np.sin([1.0, 2.0])
                          + np.exp([1.0, 2.0])).tolist(),
    "integers": tf.math.add_n([tf.constant([1]), tf.constant([2]),
                               tf.constant([3])]).numpy().tolist(),
    "pair": float(tf.math.add_n([a, b]).numpy()[0]),
}))
"""


def _sums(mode: str) -> dict:
    return run_json(CODE, mode)


def test_without_the_patch_add_n_sums_from_the_buffer_it_reuses():
    sums = _sums("unpatched")
    # The same inputs, the same op: the order follows which buffer was free.
    assert (sums["reusable"], sums["held"]) == (1.0, 0.0)
    assert sums["widest_add_n"] == 3 and sums["gradient_add_n"] == 3


def test_with_the_patch_add_n_sums_in_input_order_whatever_buffer_is_free():
    sums = _sums("patched")
    assert (sums["reusable"], sums["held"]) == (0.0, 0.0)
    # No AddN of three inputs is left, neither tf.math.add_n's nor the
    # gradient tape's sum of x's three gradients.
    assert sums["widest_add_n"] == 0 and sums["gradient_add_n"] == 0
    assert sums["gradient"] == pytest.approx(sums["expected_gradient"], rel=1e-6)
    # Integers and two inputs keep TensorFlow's op.
    assert sums["integers"] == [6] and sums["pair"] == 1e8


RACE = """
import collections, hashlib, json, sys
import tfdet
from tfdet._setup import _pools
threads, patched = int(sys.argv[1]), sys.argv[2] == "patched"
if not patched:
    _pools.INTER_OP_THREADS = threads  # the control: AddN with both pools
profile = tfdet.enable(
    seed=1, threads=threads,
    patches=["auto"] if patched else ["auto", "-fixed_order_add_n"],
)
import numpy as np
import tensorflow as tf

@tf.function
def step(x, a, b):
    # c is read by the AddN and by a reduction that may run beside it: c's
    # buffer is free for the AddN only when the reduction finished first.
    c = x * 3.0
    return tf.math.add_n([a, b, c]), tf.reduce_sum(tf.sin(c))

# The two schedules the race chooses between, each forced: c's buffer free
# for the AddN (nothing else reads c), or held (c is returned too).
@tf.function
def free(x, a, b):
    return tf.math.add_n([a, b, x * 3.0])

@tf.function
def held(x, a, b):
    c = x * 3.0
    return tf.math.add_n([a, b, c]), c

sums, forced = {}, {}
rng = np.random.default_rng(0)
for size in (10_000, 100_000, 300_000, 1_000_000):
    x, a, b = (tf.constant(rng.normal(size=size).astype("float32") * scale)
               for scale in (1.0, 1.0, 1e3))
    digest = lambda t: hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]
    found = collections.Counter(digest(step(x, a, b)[0]) for _ in range(100))
    sums[size] = sorted(found)
    forced[size] = sorted({digest(free(x, a, b)), digest(held(x, a, b)[0])})
print(json.dumps({
    "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
    "profile_inter_op": profile.inter_op_threads,
    "sums": sums,
    "forced": forced,
}))
"""


def _race(threads: int, mode: str) -> dict:
    return run_json(RACE, str(threads), mode)


def _sums_by_size(*races: dict, key: str = "sums") -> dict[str, set[str]]:
    """Each size's sums over every call of every race (`key`: the racing
    calls', or the two forced schedules')."""
    return {
        size: {found for race in races for found in race[key][size]}
        for size in races[0][key]
    }


def test_two_inter_op_threads_give_add_n_one_sum_only_with_the_patch():
    control = [_race(1, "unpatched"), _race(2, "unpatched")]
    assert [race["inter_op"] for race in control] == [1, 2]
    # Without the patch the same AddN gives other sums by whether c's buffer
    # was free: forced, the two schedules give two sums at every size. The
    # race itself chooses from call to call or from pool to pool, but not
    # always in one run: on 2.16.2 under CI's load it gave one sum a size on
    # both pools (2026-12-07), so the forced pair is the control.
    forced = _sums_by_size(*control, key="forced")
    assert all(len(sums) == 2 for sums in forced.values()), control
    patched = [_race(1, "patched"), _race(2, "patched")]
    # The patch sizes the inter-op pool with `threads`, and the profile says so.
    assert [(race["inter_op"], race["profile_inter_op"]) for race in patched] == [
        (1, 1),
        (2, 2),
    ]
    # One sum a size, every call, with either pool, forced either way: the
    # schedule decides no bit.
    racing, forced = _sums_by_size(*patched), _sums_by_size(*patched, key="forced")
    assert all(racing[size] == forced[size] for size in racing), patched
    assert all(len(sums) == 1 for sums in racing.values()), patched
