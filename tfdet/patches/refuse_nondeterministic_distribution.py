"""Refuses the tf.distribute constructs whose results follow timing.

No seed or setting makes these repeat, so under `tfdet.enable()` they raise
`tfdet.NondeterministicError` with what to use instead, the way TensorFlow's
op determinism refuses an op it cannot make deterministic:

- `ParameterServerStrategy` (V2, and TF1's V1): workers update the
  variables on the parameter servers asynchronously, each step on whatever
  values the others left, so the bits follow which worker was faster
  (TensorFlow's `enable_op_determinism` documentation names it as a source of
  nondeterminism). `MultiWorkerMirroredStrategy` trains synchronously.
- tf.data service `ShardingPolicy.DYNAMIC` (`processing_mode=
  "distributed_epoch"`): the dispatcher hands splits to whichever worker asks
  first, and the elements come out in a nondeterministic order (TensorFlow's
  documentation of `ShardingPolicy`). The static policies (OFF, FILE, DATA,
  FILE_OR_DATA, HINT) are kept.
"""

from __future__ import annotations

from typing import Any

from tfdet._errors import NondeterministicError
from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap

_PARAMETER_SERVER = (
    "every worker updates the parameter servers' variables asynchronously, so "
    "each step starts from whatever the other workers left and the bits follow "
    "their timing."
)
_DYNAMIC_SHARDING = (
    "the dispatcher hands splits to whichever tf.data worker asks first, so the "
    "elements arrive in an order that follows timing."
)


def _apply(swap: Swap) -> None:
    from tensorflow.python.data.experimental.ops import data_service_ops
    from tensorflow.python.distribute import (
        parameter_server_strategy,
        parameter_server_strategy_v2,
    )

    def refuse_parameter_server(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NondeterministicError(
            "ParameterServerStrategy",
            _PARAMETER_SERVER,
            "tf.distribute.MultiWorkerMirroredStrategy (synchronous all-reduce)",
        )

    for strategy in (
        parameter_server_strategy_v2.ParameterServerStrategyV2,
        parameter_server_strategy.ParameterServerStrategyV1,
    ):
        swap.attribute(strategy, "__init__", refuse_parameter_server)

    validate = data_service_ops._get_validated_sharding_policy  # noqa: SLF001
    dynamic = data_service_ops.ShardingPolicy.DYNAMIC

    def validated_sharding_policy(processing_mode: Any) -> Any:
        policy = validate(processing_mode)
        if policy == dynamic:
            raise NondeterministicError(
                f"tf.data service sharding {processing_mode!r}",
                _DYNAMIC_SHARDING,
                "a static ShardingPolicy (OFF, FILE, DATA, FILE_OR_DATA or HINT)",
            )
        return policy

    # Every tf.data service entry point (`distribute`, `from_dataset_id`)
    # validates its processing mode through this module-level function.
    swap.attribute(
        data_service_ops, "_get_validated_sharding_policy", validated_sharding_policy
    )


PATCH = Patch(
    summary="ParameterServerStrategy (asynchronous updates) and tf.data service "
    "DYNAMIC sharding (order follows timing) -> NondeterministicError",
    upstream="https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_op_determinism",
    apply=_apply,
    distribution={
        "refused": "ParameterServerStrategy, tf.data service DYNAMIC sharding"
    },
)
