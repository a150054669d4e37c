"""Child side of `tfdet cost --script`: a whole script, stepping when told.

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
the end of stdin) stops the script where it is; a script that ends by
itself answers what is pending with `finished`.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from tfdet._child import _script_worker
from tfdet._cost import _ops

Answer = Callable[[dict[str, Any]], None]


class _Ended(BaseException):
    """Raised from a hook when the parent ends the run: stops the script."""


class _Gate:
    """Counts the script's steps against the parent's requests."""

    def __init__(
        self, warmup: int, answer: Answer, ready: Callable[[], dict[str, Any]]
    ) -> None:
        self._warmup_left = max(1, warmup)
        self._answer = answer
        self._ready = ready
        self._started = False  # "ready" answered: steps are timed.
        self._budget = 0
        self._times: list[float] = []
        self._profiling: _ops.Profiling | None = None
        self.steps = 0
        self.resumed_at = time.perf_counter()
        self.depth = 0  # Inside fit or train_on_batch: updates are theirs.

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
            line = sys.stdin.readline()
            request = json.loads(line) if line.strip() else {"end": True}
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
                # Which of a script's models is "the" model is the script's
                # business: no digest.
                self._answer({"digest": None})
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
        for line in sys.stdin:
            request = json.loads(line)
            if "digest" in request:
                self._answer({"digest": None})
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
        args, kwargs = _script_worker.with_fit_callback(
            args, kwargs, _timed_callback(callback_base, gate)
        )
        gate.depth += 1
        try:
            return fit(self, *args, **kwargs)
        finally:
            gate.depth -= 1

    @functools.wraps(train_on_batch)
    def timed_train_on_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        gate.depth += 1
        try:
            outputs = train_on_batch(self, *args, **kwargs)
        finally:
            gate.depth -= 1
        gate.step(1000 * (time.perf_counter() - began))
        return outputs

    model_class.fit = timed_fit
    model_class.train_on_batch = timed_train_on_batch


def _hook_optimizer(optimizer_class: Any, method: str, gate: _Gate) -> None:
    import tensorflow as tf

    original = getattr(optimizer_class, method)

    @functools.wraps(original)
    def timed_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if gate.depth or not tf.executing_eagerly():
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        gate.step(1000 * (time.perf_counter() - gate.resumed_at))
        gate.resumed_at = time.perf_counter()
        return result

    setattr(optimizer_class, method, timed_update)


def _install(gate: _Gate) -> None:
    """Hooks Keras 3, and tf_keras when it is in use."""
    import keras

    from tfdet._pin import _versions

    _hook_model(keras.Model, keras.callbacks.Callback, gate)
    _hook_optimizer(keras.optimizers.Optimizer, "apply", gate)
    if _versions.uses_legacy_keras():
        import tf_keras

        _hook_model(tf_keras.Model, tf_keras.callbacks.Callback, gate)
        _hook_optimizer(tf_keras.optimizers.Optimizer, "apply_gradients", gate)


def run(
    script: str,
    args: list[str],
    warmup: int,
    answer: Answer,
    ready: Callable[[], dict[str, Any]],
) -> int:
    """Runs `script` as `python script.py args` would, under the gate.

    Returns:
        The process's exit status: 0 when the parent ended it or the script
        ended well, the script's own status (or 1 with its traceback) else.
    """
    gate = _Gate(warmup, answer, ready)
    _install(gate)
    sys.argv = [script, *args]
    # As `python script.py`: sys.path[0] is the script's directory.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except _Ended:
        return 0
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    except BaseException:  # noqa: BLE001 - the parent shows the traceback
        traceback.print_exc()
        return 1
    gate.script_ended(warmup)
    return 0
