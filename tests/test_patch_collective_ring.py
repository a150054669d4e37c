"""The `collective_ring` patch: MultiWorkerMirroredStrategy's AUTO -> RING."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python

# A one-worker MultiWorkerMirroredStrategy (no TF_CONFIG) in a fresh process:
# TensorFlow's collective context is process-global.
_DESCRIBE = """
import json
{enable}
import tensorflow as tf
from tfdet._pin import _distribution
implementations = tf.distribute.experimental.CommunicationImplementation
options = tf.distribute.experimental.CommunicationOptions(
    bytes_per_pack=64, implementation=implementations.{implementation})
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
print(json.dumps(_distribution.describe(strategy)))
"""


def _describe(enable: bool, implementation: str) -> dict:
    code = _DESCRIBE.format(
        enable="import tfdet; tfdet.enable(seed=1)" if enable else "",
        implementation=implementation,
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("enable", "implementation", "expected"),
    [
        (True, "AUTO", ("RING", "tfdet")),
        (True, "RING", ("RING", "user")),
        # Without tfdet AUTO stays AUTO: what the patch changes is visible.
        (False, "AUTO", ("AUTO", "user")),
    ],
    ids=["auto-pinned", "explicit-kept", "without-tfdet"],
)
def test_auto_becomes_ring_and_an_explicit_choice_is_kept(
    enable, implementation, expected
):
    facts = _describe(enable, implementation)
    assert (facts["collective"], facts["collective_chosen_by"]) == expected
    # The user's other options survive the replacement.
    assert facts["bytes_per_pack"] == 64
    assert (facts["strategy"], facts["workers"], facts["replicas"]) == (
        "MultiWorkerMirroredStrategy",
        1,
        1,
    )
