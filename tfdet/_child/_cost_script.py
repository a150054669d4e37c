"""The `cost` child's script: a whole script, stepping when told.

A script runs its own loop, so the parent cannot call its steps; instead
each training step ends in a hook (`_Gate.step`) that counts it and, when
the step budget the parent gave is spent, answers with the steps' times and
waits for the next request. While it waits the script is paused, so the
settings still take turns. A step is:

- a batch of `Model.fit`, from `on_train_batch_begin` to
  `on_train_batch_end`;
- a `Model.train_on_batch` call;
- in a custom loop, the time from one eager optimizer update to the next
  (`Optimizer.apply`; tf_keras `apply_gradients`): the whole step, data
  included. An update traced inside a `tf.function` runs Python once, so
  such a loop shows no steps.

The warm-up steps (at least the first, which traces) are not timed; the
"ready" answer comes at the end of the last of them. The request `end` (or
the parent closing its end) stops the script where it is; a script that
ends by itself answers what is pending with `finished`. The requests and
answers go through the child protocol's own channels (`_start`), so the
script keeps its stdin and stdout; it runs as `check --script` runs it: in
its run's own directory, with its own copy of a training-state path outside
it (`_own_copies.own_copy`), under the Keras the script chose (the
parent read it from the script, as for `check --script`).
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from tfdet._child import _keras_calls, _ops, _own_copies, _start
from tfdet._protocol._spec import WorkerSpec


class _Ended(BaseException):
    """Raised from a hook when the parent ends the run: stops the script."""


class _Gate:
    """Counts the script's steps against the parent's requests."""

    def __init__(
        self,
        warmup: int,
        ready: Callable[[], dict[str, Any]],
        digest: Callable[[list[Any]], str],
    ) -> None:
        self._warmup_left = max(1, warmup)
        self._answer = _start.answer
        self._ready = ready
        self._digest = digest
        self._started = False  # "ready" answered: steps are timed.
        self._budget = 0
        self._times: list[float] = []
        self._profiling: _ops.Profiling | None = None
        self.steps = 0
        self.resumed_at = time.perf_counter()
        self.depth = 0  # Inside fit or train_on_batch: updates are theirs.
        # What the script trained, for the digest: its models, and the
        # variables each custom loop's optimizer updated.
        self.models: list[Any] = []
        self.loops: dict[int, Callable[[], list[Any]]] = {}

    def trained(self, model: Any) -> None:
        if all(known is not model for known in self.models):
            self.models.append(model)

    def digest(self) -> dict[str, Any]:
        """The answer to `digest`: every trained weight's, and the steps."""
        variables = [weight for model in self.models for weight in model.weights]
        for loop in self.loops.values():
            variables += loop()
        if not variables:
            return {"digest": None, "why": "tfdet saw no trained model"}
        return {"digest": self._digest(variables), "steps": self.steps}

    def step(self, ms: float) -> None:
        """One training step ended, `ms` long; may wait for the parent."""
        self.steps += 1
        if not self._started:
            self._warmup_left -= 1
            if self._warmup_left == 0:
                self._started = True
                self._answer(self._ready())
                self._next()
            return
        self._times.append(ms)
        self._budget -= 1
        if self._budget == 0:
            self._reply()
            self._next()

    def _reply(self, **extra: Any) -> None:
        if self._profiling is None:
            self._answer({"ms": self._times, **extra})
            return
        ops = self._profiling.stop(len(self._times))
        self._profiling = None
        self._answer({"ops": ops, **extra})

    def _next(self) -> None:
        """Reads requests until one lets the script train on."""
        while True:
            request = _start.next_request()
            self._times = []
            if "steps" in request:
                self._budget = request["steps"]
                break
            if "profile" in request:
                self._budget = request["profile"]
                self._profiling = _ops.Profiling()
                self._profiling.start()
                break
            if "digest" in request:
                self._answer(self.digest())
                continue
            raise _Ended
        self.resumed_at = time.perf_counter()

    def script_ended(self, warmup: int) -> None:
        """The script returned by itself: answers every request left."""
        if not self._started:
            self._answer(
                {
                    "error": f"Expected the script to train more than the {warmup} "
                    f"warm-up step(s) (--warmup). Received: it ended after "
                    f"{self.steps} training step(s) that tfdet saw (fit batches, "
                    "train_on_batch calls, eager optimizer updates)."
                }
            )
            return
        self._reply(finished=True)
        while True:
            request = _start.next_request()
            if "digest" in request:
                self._answer(self.digest())
            elif "steps" in request or "profile" in request:
                self._answer({"ms": [], "ops": {}, "finished": True})
            else:
                return


def _timed_callback(base: type, gate: _Gate) -> Any:
    """A Keras callback (of `base`'s flavour) that times each fit batch."""

    class _StepTimer(base):  # type: ignore[misc, valid-type]
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._began = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            gate.step(1000 * (time.perf_counter() - self._began))

    return _StepTimer()


def _hook_model(model_class: Any, callback_base: type, gate: _Gate) -> None:
    fit, train_on_batch = model_class.fit, model_class.train_on_batch

    @functools.wraps(fit)
    def timed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        fit_args, kwargs = _keras_calls.with_fit_callback(
            args, kwargs, _timed_callback(callback_base, gate)
        )
        gate.trained(self)
        gate.depth += 1
        try:
            return fit(self, *fit_args, **kwargs)
        finally:
            gate.depth -= 1

    @functools.wraps(train_on_batch)
    def timed_train_on_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        gate.trained(self)
        gate.depth += 1
        try:
            outputs = train_on_batch(self, *args, **kwargs)
        finally:
            gate.depth -= 1
        gate.step(1000 * (time.perf_counter() - began))
        return outputs

    model_class.fit = timed_fit
    model_class.train_on_batch = timed_train_on_batch


def _hook_optimizer(
    optimizer_class: Any, method: str, gate: _Gate, variables_of: Any
) -> None:
    import tensorflow as tf

    original = getattr(optimizer_class, method)

    @functools.wraps(original)
    def timed_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if gate.depth or not tf.executing_eagerly():
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if id(self) not in gate.loops:
            variables = variables_of(self, args, kwargs)
            gate.loops[id(self)] = lambda: list(variables)
        gate.step(1000 * (time.perf_counter() - gate.resumed_at))
        gate.resumed_at = time.perf_counter()
        return result

    setattr(optimizer_class, method, timed_update)


def _install(gate: _Gate) -> None:
    """Hooks Keras 3, and tf_keras when it is in use; gives the run its own
    copy of a training-state path outside its directory (as `check
    --script` does)."""
    import keras

    from tfdet._pin import _versions

    _own_copies.own_training_state()
    _hook_model(keras.Model, keras.callbacks.Callback, gate)
    _hook_optimizer(
        keras.optimizers.Optimizer, "apply", gate, _keras_calls.keras3_variables
    )
    if _versions.uses_legacy_keras():
        import tf_keras

        _hook_model(tf_keras.Model, tf_keras.callbacks.Callback, gate)
        _hook_optimizer(
            tf_keras.optimizers.Optimizer,
            "apply_gradients",
            gate,
            _keras_calls.tf_keras_variables,
        )


def run(
    spec: WorkerSpec,
    ready: Callable[[], dict[str, Any]],
    digest: Callable[[list[Any]], str],
) -> int:
    """Runs the spec's script as `python script.py args` would, under the gate.

    `ready` gives the first answer, `digest` a digest of variables' values.

    Returns:
        The process's exit status: 0 when the parent ended it or the script
        ended well (its result written), the script's own status (or 1 with
        its traceback) else.
    """
    gate = _Gate(spec.warmup, ready, digest)
    _install(gate)
    script = _start.script_of(spec)
    sys.argv = [script, *spec.args]
    # As `python script.py`: sys.path[0] is the script's directory.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except _Ended:
        pass
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
        gate.script_ended(spec.warmup)
    except BaseException:  # noqa: BLE001 - the parent shows the traceback
        traceback.print_exc()
        return 1
    else:
        gate.script_ended(spec.warmup)
    _start.write_result(
        {"steps": gate.steps, "own_copies": dict(_own_copies.own_copies)}
    )
    return 0
