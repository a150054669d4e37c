"""Child side of `tfdet check --script`: run a user's training script as is.

Runs in a fresh process started by `tfdet._child._start` (kind `script`), in
an environment the parent has pinned and perturbed. It starts as every child
does (`_start.child_start`: tfdet enabled unless the spec says not to, the
in-child perturbations), installs recording hooks, and runs the script as
`python script.py args` would (`runpy.run_path(..., run_name="__main__")`,
`sys.argv` set). The hooks:

- every `Model.fit` call gets a `tfdet.DeterminismCallback(trace=...)`
  appended: one trace per `fit` call;
- every `Model.train_on_batch` call is recorded after it returns (its logs
  and the weights' fingerprints): one trace per model;
- every eager optimizer update outside those (a custom `GradientTape` loop:
  Keras 3 `Optimizer.apply`, which `apply_gradients` calls; tf_keras
  `apply_gradients`) is recorded with the updated variables' fingerprints
  (the loss is not known there): one trace per optimizer. An update traced
  inside a `tf.function` cannot be recorded per step; only its variables'
  final digests are compared.

At exit the final digest of every variable trained is taken. The result
(written atomically at `spec.result`) lists the traces, the final
digests, the entry points exercised, the step count, the XLA facts and how
the script ended; only the run's own process writes it (a process the
script forked never does), before the process exits when the script ends
with `os._exit(0)`. A script that raises or exits non-zero makes this process
exit non-zero (1, or the script's status) after printing its traceback, so
the parent reports the run as failed with its stderr tail.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import runpy
import sys
import time
import traceback
from typing import Any

from tfdet._child import _start
from tfdet._protocol import _spec
from tfdet._protocol._spec import WorkerSpec
from tfdet._setup import _spawned

FIT = "fit"
TRAIN_ON_BATCH = "train_on_batch"
CUSTOM = "custom loop (optimizer)"
CUSTOM_COMPILED = "custom loop (optimizer in a tf.function: final weights only)"


class _MaxStepsReached(BaseException):
    """Raised from a hook at --max-steps; a BaseException, so that a script's
    own `except Exception` does not swallow it."""


class _RecordedTraining:
    """One recorded training: a fit call, a model's train_on_batch, a loop."""

    def __init__(self, name: str, kind: str, path: str, variables: Any) -> None:
        self.name = name
        self.kind = kind
        self.path = path
        self.variables = variables  # A callable returning the variables.
        self.writer: Any = None
        self.steps = 0
        self.callback: Any = None
        self.key: Any = None

    def record(self, logs: dict[str, Any]) -> None:
        from tfdet._pin import _environment
        from tfdet._record import _bits, _trace
        from tfdet._setup import _enable

        variables = list(self.variables())
        if self.writer is None:
            header = _trace.make_header(
                _enable.observed_profile(),
                _environment.fingerprint(_enable.profile()),
                _bits.variable_names(variables),
                every=1,
                variables_every=1,
                training=self.name,
            )
            if _spec.resumed_after() is None:
                self.writer = _trace.TraceWriter(self.path, header)
            else:
                # Resumed after the `interrupt` perturbation killed this run:
                # continue its trace, numbering steps by the restored
                # optimizer (the script's own checkpoint decides where).
                self.writer = _trace.continued(self.path, header)
                self.steps = _optimizer_steps(self.key, self.steps)
        checksums = _bits.weight_checksums(variables)
        self.writer.write_step(_trace.step_record(self.steps, logs, checksums))
        self.steps += 1

    def steps_recorded(self) -> int:
        if self.callback is not None:
            return self.callback.steps_recorded_total
        return self.steps

    def to_dict(self) -> dict[str, Any]:
        entry = {
            "name": self.name,
            "kind": self.kind,
            "trace": self.path if os.path.exists(self.path) else None,
            "steps": self.steps_recorded(),
        }
        if self.kind == CUSTOM_COMPILED:
            # Not recorded one by one, but counted by the optimizer.
            iterations = getattr(self.key, "iterations", None)
            try:
                entry["updates"] = int(iterations.numpy())
            except (AttributeError, TypeError, ValueError):
                entry["updates"] = None
        return entry


class Recorder:
    """The hooks' shared state: traces, step count, --max-steps."""

    def __init__(self, base: str, max_steps: int | None) -> None:
        self.base = base
        self.max_steps = max_steps
        self.traces: list[_RecordedTraining] = []
        self.entry_points: list[str] = []
        self.models: list[Any] = []
        self.total = 0
        self.depth = 0  # > 0 inside fit / train_on_batch: no optimizer records.
        self._by_key: dict[int, _RecordedTraining] = {}

    def entry(self, name: str) -> None:
        if not self.entry_points:
            # The parent starts the CPU-burning neighbour of a run now.
            _start.report_stage(_spec.TRAINING)
        if name not in self.entry_points:
            self.entry_points.append(name)

    def new_trace(self, kind: str, label: str, variables: Any) -> _RecordedTraining:
        """A new trace, named e.g. `fit #2 (model sequential)`."""
        index = len(self.traces)
        number = sum(t.kind == kind for t in self.traces) + 1
        trace = _RecordedTraining(
            f"{kind.split(' (')[0]} #{number} ({label})",
            kind,
            f"{self.base}.{index}.jsonl",
            variables,
        )
        self.traces.append(trace)
        return trace

    def trace_for(
        self, key: Any, kind: str, label: str, variables: Any
    ) -> _RecordedTraining:
        trace = self._by_key.get(id(key))
        if trace is None:
            trace = self._by_key[id(key)] = self.new_trace(kind, label, variables)
            # Kept alive, so that its id() is never another object's.
            trace.key = key
        return trace

    def model_trained(self, model: Any) -> None:
        if all(m is not model for m in self.models):
            self.models.append(model)

    def step_done(self) -> None:
        self.total += 1
        _start.report_progress(self.total, self.max_steps or 0)
        if self.max_steps is not None and self.total >= self.max_steps:
            raise _MaxStepsReached


def _logs(model: Any, outputs: Any) -> dict[str, Any]:
    """train_on_batch's return value as a logs dict, whatever the caller asked."""
    if isinstance(outputs, dict):
        return dict(outputs)
    values = outputs if isinstance(outputs, list | tuple) else [outputs]
    names = list(getattr(model, "metrics_names", None) or [])
    if len(names) != len(values):
        names = ["loss", *(f"output_{k}" for k in range(1, len(values)))]
    return dict(zip(names, values, strict=False))


def _optimizer_steps(key: Any, default: int) -> int:
    """The index of the step just taken, by the optimizer's step count."""
    optimizer = key if hasattr(key, "iterations") else getattr(key, "optimizer", None)
    try:
        return int(optimizer.iterations.numpy()) - 1
    except (AttributeError, TypeError, ValueError):
        return default


def _updates(model: Any) -> int:
    """The updates all of `model`'s optimizers have applied, summed.

    A batch after which this did not move trained nothing (one an exact
    resume skips). All of them: a GAN's `compile` keeps its two optimizers as
    attributes (keras.io's DCGAN) and leaves `model.optimizer` an unused
    default whose count never moves.
    """
    found = [getattr(model, "optimizer", None), *vars(model).values()]
    optimizers = {
        id(value): value
        for value in found
        if hasattr(value, "iterations") and hasattr(value, "apply_gradients")
    }
    total = 0
    for optimizer in optimizers.values():
        try:
            total += int(optimizer.iterations.numpy())
        except (AttributeError, TypeError, ValueError):
            continue
    return total


def resumed_epoch_start(
    epoch: int, steps_per_epoch: int | None, kept: list[dict[str, Any]]
) -> int:
    """The global step of `epoch`'s first batch, in a fit resumed at `epoch`.

    The run that never stopped numbered its steps on from epoch 0; the
    resumed process must number them the same, or its steps are compared
    with other steps of that run. With the epoch length known, `epoch`
    epochs of it; otherwise from the killed process's trace (`kept`): a
    step it recorded in `epoch`, or the end of the epoch before.

    Args:
        epoch: The epoch the resumed fit starts at (its first
            `on_epoch_begin`).
        steps_per_epoch: `fit`'s steps per epoch, or None if unknown.
        kept: The step records the killed process wrote.
    """
    if steps_per_epoch:
        return epoch * int(steps_per_epoch)
    in_epoch = [s for s in kept if s.get("epoch") == epoch and "batch" in s]
    if in_epoch:
        return int(in_epoch[0]["step"]) - int(in_epoch[0]["batch"])
    before = [int(s["step"]) for s in kept if s.get("epoch") == epoch - 1]
    return max(before) + 1 if before else 0


def _callback_class(recorder: Recorder) -> type:
    """`DeterminismCallback` (its tf_keras flavour when in use) that counts steps.

    In a process that resumes an interrupted run, it continues the killed
    process's trace: steps are numbered from the epoch the script's own
    checkpoint restored, and a batch that trains nothing (one an exact resume
    skips: the optimizer's step count does not move) is not recorded.
    """
    from tfdet._record import _callback, _trace

    base = (
        _callback._tf_keras_class()
        if _callback._tf_keras_in_use()
        else _callback.DeterminismCallback
    )
    resuming = _spec.resumed_after() is not None

    def on_train_begin(self: Any, logs: Any = None) -> None:
        kept = []
        if resuming:
            try:
                kept = _trace.read(self.trace).steps
            except (OSError, ValueError):
                kept = []
        base.on_train_begin(self, logs)
        self._kept_steps = kept
        self._first_epoch = True
        if resuming:
            self._writer.keep(kept)
            self._updates = _updates(self.model)

    def on_epoch_begin(self: Any, epoch: int, logs: Any = None) -> None:
        if resuming and self._first_epoch:
            # The fit starts at the epoch its backup restored (Keras 3 and
            # tf_keras alike): its steps go on with the killed run's numbers.
            self._epoch_start = resumed_epoch_start(
                int(epoch), (self.params or {}).get("steps"), self._kept_steps
            )
        self._first_epoch = False
        base.on_epoch_begin(self, epoch, logs)

    def on_train_batch_end(self: Any, batch: int, logs: Any = None) -> None:
        if resuming:
            done = _updates(self.model)
            if done == self._updates:
                return  # Trained before the interruption, skipped now.
            self._updates = done
        base.on_train_batch_end(self, batch, logs)
        self.steps_recorded_total = self.steps_recorded
        recorder.step_done()

    return type(
        "_RecordingCallback",
        (base,),
        {
            "on_train_begin": on_train_begin,
            "on_epoch_begin": on_epoch_begin,
            "on_train_batch_end": on_train_batch_end,
            "steps_recorded_total": 0,
        },
    )


def with_fit_callback(
    args: tuple, kwargs: dict[str, Any], callback: Any
) -> tuple[list[Any], dict[str, Any]]:
    """`fit`'s arguments with `callback` appended to its callbacks, wherever
    the caller passed them: `fit(x, y, batch_size, epochs, verbose, callbacks)`
    positionally, or by keyword."""
    args_list, kwargs = list(args), dict(kwargs)
    if len(args_list) > 5:
        args_list[5] = [*(args_list[5] or []), callback]
    else:
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
    return args_list, kwargs


def _wrap_fit(model_class: Any, recorder: Recorder) -> None:
    original = model_class.fit

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.entry(FIT)
        trace = recorder.new_trace(FIT, f"model {self.name}", lambda: self.weights)
        callback = _callback_class(recorder)(trace=trace.path)
        trace.callback = callback
        args, kwargs = with_fit_callback(args, kwargs, callback)
        recorder.model_trained(self)
        recorder.depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            recorder.depth -= 1
            callback._close()

    model_class.fit = fit


def _wrap_train_on_batch(model_class: Any, recorder: Recorder) -> None:
    original = model_class.train_on_batch

    @functools.wraps(original)
    def train_on_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.entry(TRAIN_ON_BATCH)
        recorder.model_trained(self)
        recorder.depth += 1
        try:
            outputs = original(self, *args, **kwargs)
        finally:
            recorder.depth -= 1
        trace = recorder.trace_for(
            self, TRAIN_ON_BATCH, f"model {self.name}", lambda: self.weights
        )
        trace.record(_logs(self, outputs))
        recorder.step_done()
        return outputs

    model_class.train_on_batch = train_on_batch


def _wrap_optimizer(
    optimizer_class: Any, method: str, recorder: Recorder, variables_of: Any
) -> None:
    import tensorflow as tf

    original = getattr(optimizer_class, method)

    @functools.wraps(original)
    def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder.depth:  # fit / train_on_batch record their own steps.
            return original(self, *args, **kwargs)
        recorder.depth += 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            recorder.depth -= 1
        variables = variables_of(self, args, kwargs)
        label = f"optimizer {getattr(self, 'name', type(self).__name__)}"
        if not tf.executing_eagerly():
            # Traced inside a tf.function: Python runs once, not per step.
            recorder.entry(CUSTOM_COMPILED)
            recorder.trace_for(self, CUSTOM_COMPILED, label, lambda: variables)
            return result
        recorder.entry(CUSTOM)
        trace = recorder.trace_for(self, CUSTOM, label, lambda: variables)
        trace.record({})
        recorder.step_done()
        return result

    setattr(optimizer_class, method, apply)


def _keras3_variables(optimizer: Any, args: tuple, kwargs: dict) -> list[Any]:
    variables = kwargs.get("trainable_variables", args[1] if len(args) > 1 else None)
    return (
        list(variables)
        if variables is not None
        else list(optimizer._trainable_variables)
    )


def _tf_keras_variables(optimizer: Any, args: tuple, kwargs: dict) -> list[Any]:
    pairs = kwargs.get("grads_and_vars", args[0] if args else [])
    return [variable for _, variable in pairs]


def _after_each_call(owner: Any, name: str, then: Any) -> None:
    """Makes `owner.name` call `then()` after each call that returns."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        then()
        return result

    setattr(owner, name, wrapper)


# Where a run keeps its own copy of a training-state path that lies outside
# its directory (inside the run's mirror of the working directory).
PRIVATE_DIR = ".tfdet-own-copies"
# `{path the script gave: the run's own copy}`, for the report.
own_copies: dict[str, str] = {}
# The run's own directory (its mirror): the working directory the script
# started in, whatever `os.chdir` it calls later (set by `run`).
run_directory: str | None = None


def own_copy(path: Any) -> Any:
    """The run's own copy of a training-state path outside its directory.

    The runs start together: a backup directory such as Keras's own example
    `/tmp/backup` (or `../backup`, outside the run's mirror) was one
    directory for all of them, and a run resumed from another's backup. A
    path inside the run's directory is its own already and stays as it is.
    A relative path is resolved as the script meant it, against its working
    directory now, and compared with the run's own directory, which a
    script's `os.chdir` elsewhere does not move.
    """
    if not isinstance(path, str | os.PathLike):
        return path
    absolute = os.path.abspath(os.fspath(path))
    here = run_directory or os.getcwd()
    if absolute == here or absolute.startswith(here + os.sep):
        return path
    private = os.path.join(here, PRIVATE_DIR, absolute.lstrip(os.sep))
    own_copies[os.fspath(path)] = private
    return private


def _with_own_copy(owner: Any, parameter: str) -> None:
    """Makes `owner(...)` get the run's own copy of its `parameter` path."""
    import inspect

    original = owner.__init__
    # The signature that names it: tfdet's exact BackupAndRestore passes
    # `*args, **kwargs` on to Keras's.
    signature = next(
        sig
        for cls in owner.__mro__
        if "__init__" in vars(cls)
        and parameter in (sig := inspect.signature(vars(cls)["__init__"])).parameters
    )

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # Keras says what is wrong.
        if parameter in bound.arguments:
            bound.arguments[parameter] = own_copy(bound.arguments[parameter])
        original(*bound.args, **bound.kwargs)

    owner.__init__ = __init__


def _own_training_state() -> None:
    """Gives each run its own copy of the paths that hold training state.

    Keras 3's BackupAndRestore (`backup_dir`) and `tf.train.CheckpointManager`
    (`directory`): a resume reads them back through the same object, so the
    script never names the copy itself. A `ModelCheckpoint` file is left
    where it is: scripts load it back by its path (`load_model(path)`),
    which the copy would miss. Other absolute writes stay shared.
    """
    import keras
    import tensorflow as tf

    _with_own_copy(keras.callbacks.BackupAndRestore, "backup_dir")
    _with_own_copy(tf.train.CheckpointManager, "directory")


def _note_backups() -> None:
    """Tells the child protocol each time the script writes a backup.

    The `interrupt` perturbation kills a script's run only after one (see
    `_start.note_backup`): Keras 3's BackupAndRestore (tfdet's exact one
    under enable(), Keras's own without) and every `tf.train.Checkpoint`
    save or write, `CheckpointManager.save` included (all go through
    `Checkpoint._write`).
    """
    import keras
    import tensorflow as tf

    _after_each_call(
        keras.callbacks.BackupAndRestore, "_save_model", _start.note_backup
    )
    _after_each_call(tf.train.Checkpoint, "_write", _start.note_backup)


def _install_at_first_import(recorder: Recorder) -> None:
    """Installs the hooks once the script has imported Keras or TensorFlow.

    A run without tfdet leaves the script's own settings first: what it sets
    before `import tensorflow` (TF_ENABLE_ONEDNN_OPTS, its own
    `tfdet.enable()`, which pins oneDNN) is read at that import, so
    importing TensorFlow here, before the script, would make the script's
    `enable()` too late on a CPU where TensorFlow turns oneDNN off by itself.
    A script that imports `keras` or `tf_keras` first imports TensorFlow
    inside it: the hooks, which need that Keras, wait for it to be whole.
    """
    from tfdet.patches import _import_hook

    installed = False

    def once() -> None:
        nonlocal installed
        if not installed:
            installed = True
            install(recorder)

    def importing(name: str) -> bool:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        return getattr(spec, "_initializing", False)

    def after_tensorflow() -> None:
        if importing("keras") or importing("tf_keras"):
            return  # That Keras's own hook installs them once it is whole.
        once()

    for keras in ("keras", "tf_keras"):
        _import_hook.when_imported(keras, once)
    _import_hook.when_imported("tensorflow", after_tensorflow)


def install(recorder: Recorder) -> None:
    """Installs the hooks on Keras 3, and on tf_keras when it is in use."""
    import keras

    from tfdet._pin import _versions

    _note_backups()
    _own_training_state()
    _wrap_fit(keras.Model, recorder)
    _wrap_train_on_batch(keras.Model, recorder)
    _wrap_optimizer(keras.optimizers.Optimizer, "apply", recorder, _keras3_variables)
    if _versions.uses_legacy_keras():
        import tf_keras

        _wrap_fit(tf_keras.Model, recorder)
        _wrap_train_on_batch(tf_keras.Model, recorder)
        _wrap_optimizer(
            tf_keras.optimizers.Optimizer,
            "apply_gradients",
            recorder,
            _tf_keras_variables,
        )


def _keras_of(model: Any) -> str:
    """`"tf_keras"` or `"Keras 3"`: the Keras a model is built with."""
    return "tf_keras" if type(model).__module__.startswith("tf_keras") else "Keras 3"


def final_digests(recorder: Recorder) -> dict[str, dict[str, str]]:
    """`{trace name: {variable: digest}}` for every training recorded."""
    import numpy as np

    from tfdet._record import _bits

    digests = {}
    for trace in recorder.traces:
        variables = list(trace.variables())
        digests[trace.name] = _bits.weights_digests(
            variables, [np.asarray(v) for v in variables]
        )
    return digests


def _print_script_traceback(error: BaseException, script: str) -> None:
    """The traceback as `python script.py` prints it: from the script's frame."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb or error.__traceback__)
    sys.stderr.flush()


def _hook_os_exit(finish: Any) -> None:
    """Makes the script's `os._exit(0)` write the run's result first.

    `os._exit` skips everything after it, the result this process writes
    when the script returns included; a script that ends that way (to skip
    slow interpreter shutdown, or threads that never end) would be a failed
    run. `finish(end)` writes the result from what was recorded so far. A
    non-zero status is the script's failure, reported as such; a process the
    script forked exits at once (it never writes the run's result).
    """
    real_exit = os._exit

    @functools.wraps(real_exit)
    def _exit(status: int) -> None:
        if status == 0 and _start.is_owner():
            sys.stdout.flush()
            try:
                finish(f"called os._exit({status})")
            except BaseException:  # noqa: BLE001 - then the run fails with it
                traceback.print_exc()
                status = 1
            sys.stderr.flush()
        real_exit(status)

    os._exit = _exit


def run(spec: WorkerSpec) -> int:
    """Runs the script under the hooks; writes the result; returns the exit status."""
    global run_directory
    started = time.perf_counter()
    run_directory = os.getcwd()
    _start.child_start(spec)
    # Its multiprocessing children start as `tfdet run`'s do: enabled with
    # the run's settings before the script's code runs in them.
    _spawned.give_spawned_children_the_profile(
        json.dumps(_start.enable_settings(spec)) if spec.enable else None
    )
    recorder = Recorder(spec.trace, spec.max_steps)
    if spec.enable:
        install(recorder)
    else:
        _install_at_first_import(recorder)
    script = spec.script
    sys.argv = [script, *spec.args]
    # As `python script.py`: sys.path[0] is the directory of the script's
    # real file (the run's copy of a linked script is not a link).
    sys.path[0] = os.path.abspath(
        spec.script_dir or os.path.dirname(os.path.realpath(script))
    )
    _hook_os_exit(
        lambda end: _write_result(spec, recorder, end, time.perf_counter() - started)
    )
    end, status = "completed", 0
    try:
        runpy.run_path(script, run_name="__main__")
    except _MaxStepsReached:
        end = f"stopped at --max-steps {recorder.max_steps}"
    except SystemExit as exit_:
        code = exit_.code
        if code not in (None, 0):
            end = f"called sys.exit({code!r})"
            status = code if isinstance(code, int) else 1
            if not isinstance(code, int):
                # What the interpreter itself does with sys.exit("message"),
                # so the run's stderr is the one `python train.py` gives.
                sys.stderr.write(f"{code}\n")
    except BaseException as error:  # noqa: BLE001 - the script's failure is the report
        _print_script_traceback(error, script)
        from tfdet._errors import ProfileMismatchError

        if isinstance(error, ProfileMismatchError):
            # The script's own enable() asks for other settings than the
            # runs pinned: say which flags make them agree.
            from tfdet._setup._launch import mismatch_message

            hint = mismatch_message(error).replace("tfdet run", "tfdet check --script")
            logging.getLogger("tfdet").error("tfdet: %s", hint)
        end = "raised"
        status = 1
    if not _start.is_owner():
        # A process the script forked, ending here: only the run's own
        # process reports (and Python's exit handlers are the parent's).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status if isinstance(status, int) else 1)
    if status:
        sys.stderr.flush()
        return status
    _write_result(spec, recorder, end, time.perf_counter() - started)
    return 0


def _write_result(
    spec: WorkerSpec, recorder: Recorder, end: str, seconds: float
) -> None:
    """Writes the run's result: how it ended, its traces and final digests."""
    for trace in recorder.traces:
        if trace.callback is not None:
            # Whole already (each line is flushed); closed for a fit that
            # `os._exit` ended.
            trace.callback._close()
    not_interrupted = _start.interrupt_not_applied()
    if not_interrupted is not None:
        # The run meant to be killed and resumed finished whole: it is an
        # uninterrupted run, and the report says why.
        from tfdet._protocol import _perturb

        # Under either name that kills and resumes (the parent keeps the
        # one its run was given).
        for name in (_perturb.INTERRUPT, _perturb.MIGRATE):
            _start.note_not_applied(name, not_interrupted)
    from tfdet._child import _xla

    result = {
        **(_start.run_facts(spec) if spec.enable else {"profile": None}),
        "script": spec.script,
        "args": list(spec.args),
        "end": end,
        "traces": [trace.to_dict() for trace in recorder.traces],
        "entry_points": recorder.entry_points,
        # Which Keras the trained models came from: the script's own choice.
        # A custom loop's Keras is its optimizer's (its model is not seen).
        "keras": sorted(
            {_keras_of(model) for model in recorder.models}
            | {
                _keras_of(trace.key)
                for trace in recorder.traces
                if trace.kind in (CUSTOM, CUSTOM_COMPILED)
            }
        ),
        "steps_recorded": sum(t.steps_recorded() for t in recorder.traces),
        "final_weights": final_digests(recorder),
        "xla": _xla.facts(recorder.models),
        "own_copies": dict(own_copies),
        "spawned": _spawned.started,
        "seconds": seconds,
    }
    _start.write_result(result)
