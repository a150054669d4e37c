"""The `refuse_nondeterministic_distribution` patch: what no setting makes repeat.

Under the patch, building a `ParameterServerStrategy` (V2 and TF1's V1) and
asking the tf.data service for DYNAMIC sharding raise
`tfdet.NondeterministicError` saying what to use instead; static sharding
policies pass, and `restore()` gives TensorFlow's behaviour back.
"""

from __future__ import annotations

import pytest

import tfdet
from tfdet._patching import _registry

tf = pytest.importorskip("tensorflow")

_NAME = "refuse_nondeterministic_distribution"


@pytest.fixture
def patch():
    installed = _NAME in _registry.installed()
    _registry.install([_NAME])
    yield
    if not installed:
        _registry.restore([_NAME])


@pytest.mark.parametrize(
    "build",
    [
        lambda: tf.distribute.experimental.ParameterServerStrategy(None),
        lambda: tf.compat.v1.distribute.experimental.ParameterServerStrategy(),
    ],
    ids=["v2", "v1"],
)
def test_parameter_server_strategy_is_refused_with_what_to_use(patch, build):
    with pytest.raises(tfdet.NondeterministicError) as raised:
        build()
    assert raised.value.construct == "ParameterServerStrategy"
    assert "MultiWorkerMirroredStrategy" in str(raised.value)


def test_dynamic_sharding_is_refused_and_static_policies_pass(patch):
    service = tf.data.experimental.service
    with pytest.raises(tfdet.NondeterministicError, match="static ShardingPolicy"):
        # Refused before any dispatcher is contacted (none runs here).
        tf.data.Dataset.range(3).apply(
            service.distribute("distributed_epoch", "grpc://127.0.0.1:1")
        )
    from tensorflow.python.data.experimental.ops import data_service_ops

    validate = data_service_ops._get_validated_sharding_policy  # noqa: SLF001
    assert validate("parallel_epochs") == service.ShardingPolicy.OFF
    assert validate(service.ShardingPolicy.DATA) == service.ShardingPolicy.DATA


def test_restore_gives_tensorflow_its_behaviour_back():
    if _NAME in _registry.installed():
        pytest.skip("the patch is installed in this process")
    from tensorflow.python.data.experimental.ops import data_service_ops

    original = data_service_ops._get_validated_sharding_policy  # noqa: SLF001
    _registry.install([_NAME])
    _registry.restore([_NAME])
    assert data_service_ops._get_validated_sharding_policy is original  # noqa: SLF001
    dynamic = tf.data.experimental.service.ShardingPolicy.DYNAMIC
    assert original("distributed_epoch") == dynamic
