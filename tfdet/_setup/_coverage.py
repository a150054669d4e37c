"""What a profile promises, less what the traced model ran against it.

A profile's tiers (`tfdet._pin._tiers`) say where its bits repeat for the
ops tfdet covers. A model may still run ops it does not cover: TensorFlow's
own MatMul on bfloat16 under a mixed-precision policy (the kernels and the
compositions take float32), a 3-D convolution's filter gradient, an op with
approximate x86 instructions that no patch replaces. Their bits follow what
the profile otherwise frees, and the tiers that need it do not hold for that
model. This module finds them, by measurement:

- the op types of every function the process traced, matched
  against the hazard table's CPU rows (`pool_size_dependent`: the pool
  size; `machine_dependent`: the CPU model) and against the products whose
  per-sample results follow the batch;
- the inputs a patch itself left to TensorFlow's op (`_exact_math.left_ops`:
  a dtype or shape its replacement does not take).

One record, `Coverage`, carries the answer to `enable()`'s log, to
`tfdet.coverage()`, to `Profile.tiers(coverage=...)`, to `tfdet cost`'s
tiers and to `tfdet check`'s report, so that they say the same. Ops run
eagerly, outside any `tf.function`, are not seen.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

from tfdet._patching import _exact_math, _hazards
from tfdet._pin import _tiers

_LOG = logging.getLogger("tfdet")

# What an uncovered op's bits may follow, as reports write it.
POOL = "the thread-pool size"
CPU_MODEL = "the CPU model"
BATCH = "the batch"
# The tiers each of those takes away (any x86 CPU includes any core count).
_TAKES = {
    POOL: (_tiers.ANY_THREAD_COUNT, _tiers.ANY_X86_CPU),
    CPU_MODEL: (_tiers.ANY_X86_CPU,),
    BATCH: (_tiers.ANY_BATCH,),
}
# TensorFlow's products whose per-sample results follow the batch (oneDNN
# and Eigen block them by the row count). Gradients decide no prediction.
_BATCH_DEPENDENT_PRODUCTS = ("BatchMatMulV2", "BatchMatMulV3", "Einsum", "MatMul")


@dataclasses.dataclass(frozen=True)
class Uncovered:
    """One op of the model that the profile's patches do not cover.

    Attributes:
        op: TensorFlow's op type.
        follows: What its bits may follow (`POOL`, `CPU_MODEL`, `BATCH`).
        why: Why tfdet left it: "traced" (no patch replaces it where it
            ran) or what a patch could not take ("bfloat16", a shape).
    """

    op: str
    follows: tuple[str, ...]
    why: str


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The ops of a model its profile does not cover, and the tiers lost.

    Attributes:
        uncovered: The uncovered ops, by op type.
        lost: Names of the tiers the profile gives that this model's bits
            do not keep, in the tiers' order.
    """

    uncovered: tuple[Uncovered, ...] = ()
    lost: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: every uncovered op and the tiers lost, or that none is."""
        if not self.uncovered:
            return "every op tfdet knows to follow the machine is covered"
        ops = "; ".join(
            f"{op.op}{'' if op.why == 'traced' else f' on {op.why}'} (its bits "
            f"may follow {' and '.join(op.follows)})"
            for op in self.uncovered
        )
        lost = ", ".join(_tiers.TIERS[name].label for name in self.lost)
        return f"not covered by tfdet: {ops}; tiers lost: {lost}"

    @classmethod
    def merged(cls, records: Iterable[Coverage]) -> Coverage:
        """What any of `records` left uncovered (the runs of one check, whose
        pools may differ), and every tier one of them lost."""
        follows: dict[tuple[str, str], set[str]] = {}
        lost: set[str] = set()
        for record in records:
            lost.update(record.lost)
            for op in record.uncovered:
                follows.setdefault((op.op, op.why), set()).update(op.follows)
        return cls(
            uncovered=tuple(
                Uncovered(op, tuple(what for what in _TAKES if what in whats), why)
                for (op, why), whats in sorted(follows.items())
            ),
            lost=tuple(name for name in _tiers.TIERS if name in lost),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Coverage:
        """Inverse of `to_dict`."""
        return cls(
            uncovered=tuple(
                Uncovered(op["op"], tuple(op["follows"]), op["why"])
                for op in data.get("uncovered", ())
            ),
            lost=tuple(data.get("lost", ())),
        )


def of(
    profile: dict[str, Any],
    op_types: Iterable[str],
    left: Iterable[tuple[str, str]] = (),
    xla: bool = False,
    device: str = "cpu",
) -> Coverage:
    """The coverage of a model that ran `op_types` under `profile`.

    Args:
        profile: The run's `tfdet.Profile`, as `Profile.to_dict()` gives it.
        op_types: The op types its traced functions hold.
        left: `(op type, dtype or reason)` of the inputs a patch left to
            TensorFlow (`_exact_math.left_ops`).
        xla: Whether it trained with XLA.
        device: "cpu" or "gpu" (on a GPU no CPU tier is promised).
    """
    claimed = _tiers.given(profile, xla, device)
    if device == "gpu" or not claimed:
        return Coverage()
    version = str(profile["tensorflow_version"])
    op_types = set(op_types)
    # One thread is the pool every machine runs alike.
    pools = profile["intra_op_threads"] != 1
    found: dict[str, list[str]] = {}
    # What a patch could not take names the op better than "traced".
    why = {op: "traced" for op in op_types} | dict(left)

    def follows(op: str, what: str) -> None:
        whats = found.setdefault(op, [])
        if what not in whats:
            whats.append(what)

    for op in _hazards.pool_size_dependent(op_types, version) if pools else ():
        follows(op, POOL)
    for op in _hazards.with_behaviour(op_types, _hazards.MACHINE_DEPENDENT, version):
        follows(op, CPU_MODEL)
    for op in op_types.intersection(_BATCH_DEPENDENT_PRODUCTS):
        follows(op, BATCH)
    for op, _ in left:
        if pools:
            follows(op, POOL)
        # A gradient decides no prediction.
        if "Grad" not in op and "Backprop" not in op:
            follows(op, BATCH)
    uncovered = tuple(
        Uncovered(op, tuple(whats), why[op])
        for op, whats in sorted(found.items())
        # An op counts where it takes a tier the profile gives.
        if any(tier in claimed for what in whats for tier in _TAKES[what])
    )
    taken = {tier for op in uncovered for what in op.follows for tier in _TAKES[what]}
    lost = tuple(tier.name for tier in claimed if tier in taken)
    return Coverage(uncovered, lost)


def executed_op_types() -> set[str]:
    """Op types of every function this process has traced or run.

    Read from the eager context's function library, which holds each
    `tf.function` graph (a Keras training step among them) with its nested
    and gradient functions, as traced: before Grappler fuses or rewrites
    ops. Ops run eagerly, outside any function, are not in it.
    """
    from tensorflow.python.eager import context

    library = context.context()
    return {
        node.op
        for name in library.list_function_names()
        for node in library.get_function_def(name).node_def
    }


def measured(
    profile: dict[str, Any], xla: bool = False, op_types: set[str] | None = None
) -> Coverage:
    """The coverage of what this process traced so far under `profile`
    (`op_types`: `executed_op_types()` where the caller read it already)."""
    from tfdet._pin import _devices

    device = "gpu" if _devices.gpu_visible() else "cpu"
    if op_types is None:
        op_types = executed_op_types()
    return of(profile, op_types, _exact_math.left_ops(), xla, device)


_logged = False


def log(profile: dict[str, Any]) -> None:
    """Logs this process's coverage, once: a warning naming the uncovered
    ops and the tiers they take, or a line at INFO that none is."""
    global _logged
    if _logged or "tensorflow" not in sys.modules:
        return
    _logged = True
    coverage = measured(profile)
    if coverage.uncovered:
        kept = [name for name in _tiers_of(profile) if name not in coverage.lost]
        _LOG.warning(
            "tfdet: in the traced model, %s; tiers kept: %s (tfdet.coverage() "
            "returns this record).",
            coverage.describe(),
            ", ".join(_tiers.TIERS[name].label for name in kept) or "no tier",
        )
    else:
        _LOG.info("tfdet: coverage of the traced model: %s", coverage.describe())


def _tiers_of(profile: dict[str, Any]) -> list[str]:
    return [tier.name for tier in _tiers.given(profile)]


def watch(profile: dict[str, Any]) -> None:
    """Logs the coverage after the first step Keras trains (the first call of
    a model's train function, which traces it), or at exit for a training
    loop of one's own."""
    report = functools.partial(log, profile)
    for module, owner in (
        ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer"),
        ("tf_keras.src.engine.training", "Model"),
    ):
        trainer = getattr(sys.modules.get(module), owner, None)
        if trainer is not None and not hasattr(trainer, "_tfdet_coverage"):
            _after_first_step(trainer, report)
    atexit.register(report)


def _after_first_step(trainer: Any, report: Callable[[], None]) -> None:
    """Wraps `trainer.make_train_function` so that the train function it
    makes calls `report` after its first call, then steps aside."""
    make = trainer.make_train_function

    def make_train_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = make(self, *args, **kwargs)
        function = self.train_function
        # Said already (train_on_batch asks for the function at every call).
        if _logged or function is None or getattr(function, "_tfdet_coverage", False):
            return made

        def train_function(*inputs: Any, **options: Any) -> Any:
            result = function(*inputs, **options)
            report()
            # Once traced and said, the steps that follow call Keras's own
            # function: nothing of this stays on the per-step path.
            self.train_function = function
            return result

        train_function._tfdet_coverage = True  # type: ignore[attr-defined]
        self.train_function = train_function
        # tf_keras returns the function (fit assigns what it returns).
        return train_function if made is function else made

    trainer._tfdet_coverage = True
    trainer.make_train_function = make_train_function
