"""Child of `tfdet cost` (kind `cost`): one setting, stepping when told.

Started by the runner as every child is (`python -m tfdet._child SPEC_JSON`),
it starts as every child does (`_start.child_start`: `tfdet.enable()` with
the setting's threads, ISA cap and patches, or Keras's seeding only for plain
TensorFlow). A TARGET is then built and trains `warmup` untimed steps
(tracing, first oneDNN primitives); a script runs whole, paused between
requests (`_cost_script`). Then it answers each of its parent's requests
(`_start.next_request`, a pipe of tfdet's own; `_start.answer`, the
progress channel), never on stdin or stdout, which belong to the TARGET or
script:

- `{"steps": N}`: trains N steps, answers `{"ms": [...]}` (each step's
  wall time; `train_on_batch` returns host values, so a step is done when it
  returns);
- `{"profile": N}`: trains N steps under TensorFlow's profiler, answers
  `{"ops": {op type: {"ms": per step, "node": the costliest node}}}`;
- `{"digest": true}`: answers `{"digest": ..., "steps": ...}`: a digest of
  the weights trained so far and the steps trained (a script's: every
  model and custom loop the hooks saw), or `{"digest": null, "why": ...}`;
- `{"end": true}` (or the parent closing its end): writes the result and
  exits.

Its first answer is `{"ready": true, "xla": ..., "profile": ..., "device":
..., "device_name": ...}` (where it trains: "gpu" when TensorFlow places
its ops on a GPU, with the GPU's name, else "cpu"); a TARGET
that cannot be built is a `TargetError` (exit 2, the protocol's result),
a script that trains no more than the warm-up answers `{"error": ...}`. A
script that ends by itself adds `"finished": true` to the answer it was
giving.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Any

from tfdet._child import _ops, _start, _xla
from tfdet._protocol._spec import WorkerSpec
from tfdet._target import _feeding


def digest(variables: Iterable[Any]) -> str:
    """A short digest of the values of `variables` (arrays or variables)."""
    import numpy as np

    sha = hashlib.sha256()
    for variable in variables:
        sha.update(np.ascontiguousarray(np.asarray(variable)).tobytes())
    return sha.hexdigest()[:16]


def _device() -> tuple[str, str | None]:
    """Where TensorFlow places this process's ops: ("gpu", its name) when it
    lists a GPU (the first, where Keras trains), else ("cpu", None)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", None
    details = tf.config.experimental.get_device_details(gpus[0])
    return "gpu", str(details.get("device_name") or gpus[0].name)


def ready(spec: WorkerSpec, xla: bool) -> dict[str, Any]:
    """The first answer: built and warmed up, whether XLA is on, the profile,
    where it trains."""
    from tfdet._setup import _coverage, _enable

    device, device_name = _device()
    profile = _enable.observed_profile(spec.seed).to_dict()
    return {
        "ready": True,
        "xla": xla,
        "profile": profile,
        # What the warm-up traced that the profile does not cover.
        "coverage": _coverage.measured(profile, xla).to_dict(),
        "device": device,
        "device_name": device_name,
    }


class _Stepper:
    """Trains the built TARGET one `train_on_batch` step at a time."""

    def __init__(self, built: Any, target: str) -> None:
        self._built = built
        self.steps = 0
        _feeding.feed_as_fit(built.model, target)

    def step(self) -> None:
        x, y = self._built.batch(self.steps)
        self._built.model.train_on_batch(
            x, y, sample_weight=self._built.sample_weight(self.steps)
        )
        self.steps += 1

    def timed(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self.step()
            times.append(1000 * (time.perf_counter() - start))
        return times

    def profiled(self, count: int) -> dict[str, dict[str, Any]]:
        profiling = _ops.Profiling()
        profiling.start()
        for _ in range(count):
            self.step()
        return profiling.stop(count)


def _run_target(spec: WorkerSpec) -> int:
    from tfdet._protocol import _spec
    from tfdet._target import _load

    # As a check's run: the parent tells a TARGET that exits or hangs while
    # being built from a run that fails later.
    target = _start.target_of(spec)
    _start.report_stage(_spec.BUILDING)
    built = _load.build(target, seed=spec.seed)  # TargetError: exit 2.
    _load.check_fits(built, target)
    _start.report_stage(_spec.BUILT)
    model = built.model
    if spec.jit_compile is not None:
        # Before the first step, which traces the train function with it.
        # Under op determinism Keras keeps True only where a deterministic
        # XLA lowering exists for every layer.
        model.jit_compile = spec.jit_compile
    stepper = _Stepper(built, target)
    stepper.timed(spec.warmup)
    _start.answer(ready(spec, bool(getattr(model, "jit_compile", False))))
    answered = 0
    while True:
        request = _start.next_request()
        if "steps" in request:
            _start.answer({"ms": stepper.timed(request["steps"])})
        elif "profile" in request:
            _start.answer({"ops": stepper.profiled(request["profile"])})
        elif "digest" in request:
            _start.answer(
                {"digest": digest(model.get_weights()), "steps": stepper.steps}
            )
        else:
            break
        answered += 1
    _start.write_result({"steps": stepper.steps, "answered": answered})
    return 0


def run(spec: WorkerSpec) -> int:
    """The cost child's work: see the module doc."""
    _start.child_start(spec)
    if spec.script is not None:
        from tfdet._child import _cost_script

        def first_answer() -> dict[str, Any]:
            # What the script's own compile calls asked of XLA.
            return ready(spec, any(entry["effective"] for entry in _xla.compiled))

        return _cost_script.run(spec, first_answer, digest)
    return _run_target(spec)
