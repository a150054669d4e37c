"""Child of `tfdet check` (kind `check`): train a TARGET and record every bit.

Runs in a fresh process that `tfdet._child._start` started and whose
environment the parent perturbed. It reports each step's progress and
records the run as a trace (`spec.trace`, the format `tfdet.DeterminismCallback`
writes and `tfdet diff` reads: every step's loss and metric bits and weight
fingerprints). The final weights are saved (`.npz`) so that a divergence in
the weights can be shown element by element. Last, it writes its result
(`_start.write_result`) naming the trace, the weights file and each
variable's exact final digest.
"""

from __future__ import annotations

import time
from typing import Any

from tfdet._child import _start
from tfdet._protocol import _spec
from tfdet._protocol._spec import WorkerSpec
from tfdet._target import _feeding


def _strategy(spec: WorkerSpec) -> Any:
    """The `tf.distribute` strategy of a distributed run, or None.

    Several workers: a `MultiWorkerMirroredStrategy` over the loopback
    cluster the parent put in `TF_CONFIG`. Several replicas: a
    `MirroredStrategy` over as many logical CPU devices, split from the one
    physical CPU before TensorFlow's runtime starts.
    """
    workers, replicas = spec.workers, spec.replicas
    if workers == 1 and replicas == 1:
        return None
    import tensorflow as tf

    if workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{index}" for index in range(replicas)]
    )


def _train_step(model: Any, x: Any, y: Any, weights: Any = None) -> dict[str, Any]:
    # Each step logs its own loss: Keras before 3.13 or so does not reset the
    # metrics in train_on_batch, so its loss is a mean since the process
    # started, which a process that resumes a run restarts: a resumed run's
    # loss would differ where its weights do not.
    model.reset_metrics()
    try:
        logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
    except TypeError:  # tf_keras v1 (graph-mode) models have no return_dict.
        outputs = model.train_on_batch(x, y, sample_weight=weights)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        logs = dict(zip(model.metrics_names, outputs, strict=False))
    return _flat(logs)


def _flat(logs: dict[str, Any]) -> dict[str, Any]:
    """Nested logs as Keras's own `pythonify_logs` flattens them.

    A `train_step` that returns `{m.name: m.result() for m in self.metrics}`
    (keras.io's guide) gives `compile_metrics` as a dict of its metrics;
    Keras 3.15's `train_on_batch` flattens it, Keras 3.5's does not, and a
    dict is no number whose bits can be compared (the check said
    "diverged" on the guide's model there).
    """
    flat: dict[str, Any] = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            flat.update(_flat(value))
        else:
            flat[name] = value
    return flat


def _build_before_the_first_step(model: Any, batch: tuple[Any, Any, Any]) -> None:
    """Creates a Keras 3 model's optimizer and metric variables before step 0.

    Keras 3 creates them inside the first trace of its train function, and a
    `tf.function` that creates variables on its first call is traced twice.
    Building them first, with Keras's own `_symbolic_build` (what Keras does
    itself under a distribution strategy), saves that second trace: the
    built-in CNN's first step took 2.4-2.6 s of CPU, now 1.3-1.4 s with the
    build (a 2-core EPYC Zen 3). The variables start at their initial values
    either way (zeros), and the reference models' digests are unchanged.
    tf_keras models have no `_symbolic_build` and are left as they are, and
    so is a model Keras cannot build symbolically: its first step builds it.
    """
    symbolic_build = getattr(model, "_symbolic_build", None)
    if symbolic_build is None:
        return
    try:
        symbolic_build(data_batch=batch)
    except Exception:  # noqa: BLE001 - only a saving: the first step builds it.
        return


def start(spec: WorkerSpec) -> Any:
    """`_start.child_start`, then builds the TARGET (under its strategy).

    Tells the parent when the build starts and when the TARGET is built and
    its first batch fits the model (`_load.check_fits`; a misfit is a
    `TargetError`, exit 2).

    Shared by the check and locate children, so that their runs start the
    same way.

    Returns:
        The `tfdet._target._load.Built` target.
    """
    from tfdet._target import _load

    _start.child_start(spec)
    target = _start.target_of(spec)
    strategy = _strategy(spec)
    _start.report_stage(_spec.BUILDING)
    if strategy is None:
        built = _load.build(target, seed=spec.seed)
    else:
        # The TARGET builds and compiles its model under the strategy, as a
        # user's `with strategy.scope():` block does.
        with strategy.scope():
            built = _load.build(target, seed=spec.seed)
    _load.check_fits(built, target)
    _start.report_stage(_spec.BUILT)
    return built


class _Resumable:
    """A TARGET run's checkpoint for the `interrupt` perturbation.

    Saved after every step, as a careful user checkpoints a custom loop: the
    model and optimizer in a `tf.train.Checkpoint`, and with tfdet enabled
    also `tfdet.random_state(model)` (the layers' seed states, which Keras 3
    keeps out of a model's checkpoint). Without tfdet, what a user writes
    without it: the model and optimizer only.
    """

    def __init__(self, built: Any, spec: WorkerSpec) -> None:
        import tensorflow as tf

        from tfdet._resume import _keras3

        model = built.model
        if not getattr(model, "built", False):
            # A subclassed model makes its weights on its first call.
            model(built.batch(0)[0], training=False)
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        self.steps_done = tf.Variable(0, dtype=tf.int64)
        items = {"model": model, "optimizer": model.optimizer, "steps": self.steps_done}
        if spec.enable:
            items["random"] = _keras3.random_state(model)
        self._manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(**items), spec.resume_dir, max_to_keep=2
        )

    def save(self, steps_done: int) -> None:
        self.steps_done.assign(steps_done)
        self._manager.save(checkpoint_number=steps_done)

    def restore(self) -> int:
        """Restores the last checkpoint; the steps it had done."""
        self._manager.restore_or_initialize()
        return int(self.steps_done.numpy())


def _train_on_batches(built: Any, spec: WorkerSpec) -> None:
    """Trains one `train_on_batch` step at a time, recording each in the trace.

    A run of the `interrupt` perturbation (`spec.resume_dir`) checkpoints
    every step; the process that resumes it restores the last checkpoint,
    keeps the killed process's trace up to there and trains the rest.
    """
    from tfdet._pin import _environment
    from tfdet._record import _batches, _bits, _trace
    from tfdet._setup import _enable

    model = built.model
    _feeding.feed_as_fit(model, _start.target_of(spec))
    resumable = _Resumable(built, spec) if spec.resume_dir else None
    first = 0
    if resumable is not None and _spec.resumed_after() is not None:
        first = resumable.restore()
    writer = None
    try:
        for step in range(first, spec.steps):
            x, y = built.batch(step)
            sample_weight = built.sample_weight(step)
            if step == first:
                _build_before_the_first_step(model, (x, y, sample_weight))
            logs = _train_step(model, x, y, sample_weight)
            if writer is None:
                # After the first step: a model may create its weights then.
                header = _trace.make_header(
                    _enable.observed_profile(spec.seed),
                    _environment.fingerprint(_enable.profile()),
                    _bits.variable_names(model.weights),
                    every=1,
                    variables_every=1,
                )
                writer = (
                    _trace.continued(spec.trace, header)
                    if first
                    else _trace.TraceWriter(spec.trace, header)
                )
            checksums = _bits.weight_checksums(model.weights)
            writer.write_step(
                _trace.step_record(
                    step,
                    logs,
                    checksums,
                    data=_batches.fingerprint((x, y, sample_weight)),
                )
            )
            if resumable is not None:
                resumable.save(step + 1)
            _start.report_progress(step + 1, spec.steps)
    finally:
        if writer is not None:
            writer.close()


def _fit_distributed(built: Any, spec: WorkerSpec) -> None:
    """Trains with `model.fit` under the model's strategy, as users do.

    The TARGET's batches for `spec.steps` steps become one `tf.data`
    dataset of global batches, which Keras and `tf.distribute` split among
    the replicas and workers; `tfdet.DeterminismCallback` records the trace
    (with the strategy's replica and worker facts in its header).

    Raises:
        TargetError: the batches differ in size, or a batch does not split
            evenly among the replicas.
    """
    import numpy as np
    import tensorflow as tf

    from tfdet._errors import TargetError
    from tfdet._record import _callback
    from tfdet._target import _load

    model, steps = built.model, spec.steps
    batches = [(*built.batch(step), built.sample_weight(step)) for step in range(steps)]
    sizes = sorted({_load.num_samples(batch[0]) for batch in batches})
    replicas = model.distribute_strategy.num_replicas_in_sync
    if len(sizes) > 1 or sizes[0] % replicas:
        raise TargetError(
            f"Expected batches of one size that splits evenly among {replicas} "
            f"replicas. Received: batch sizes {sizes}"
        )

    def stack(parts: list[Any]) -> Any:
        return tf.nest.map_structure(
            lambda *arrays: np.concatenate([np.asarray(a) for a in arrays]), *parts
        )

    columns = [stack([batch[k] for batch in batches]) for k in range(2)]
    if batches[0][2] is not None:
        columns.append(stack([batch[2] for batch in batches]))
    dataset = tf.data.Dataset.from_tensor_slices(tuple(columns)).batch(sizes[0])
    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=steps,
        verbose=0,
        shuffle=False,
        callbacks=[
            _callback.DeterminismCallback(spec.trace),
            # tf.keras is the Keras the model was built with (tf_keras or 3).
            tf.keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: _start.report_progress(
                    batch + 1, steps
                )
            ),
        ],
    )


def run(spec: WorkerSpec) -> None:
    """Trains `spec.target` for `spec.steps` steps and records the bits."""
    import numpy as np

    from tfdet._child import _xla
    from tfdet._protocol import _predict
    from tfdet._record import _bits

    started = time.perf_counter()
    built = start(spec)
    model = built.model
    facts = _start.run_facts(spec)
    if (spec.workers, spec.replicas) != (1, 1):
        _fit_distributed(built, spec)
        entry_point = "fit"
    else:
        _train_on_batches(built, spec)
        entry_point = "train_on_batch"
        custom = _feeding.custom_train_step(model)
        if custom is not None:
            # What it fed the model's own step, which `fit` would feed it.
            batch = (
                "(x, y)" if built.sample_weight(0) is None else "(x, y, sample_weight)"
            )
            entry_point += (
                f" into the train_step of {custom}, given {batch} as fit gives it"
            )
    final = model.get_weights()
    final_weights = _bits.weights_digests(model.weights, final)
    predicted = {}
    mode = _predict.requested()
    if mode is not None:
        inputs = _predict.inputs_of(built, spec.steps)
        predicted = _predict.predict(model, inputs, mode)
    weights_path = spec.result + ".npz"
    np.savez(weights_path, *final)
    _start.write_result(
        {
            **facts,
            "variables": list(final_weights),
            "trace": spec.trace,
            "steps_recorded": spec.steps,
            "final_weights": final_weights,
            "weights_file": weights_path,
            "synthesized_data": built.synthesized,
            # What ran: the entry point tfdet drove, and whether XLA compiled it.
            "entry_points": [entry_point],
            "xla": _xla.facts([model]),
            "seconds": time.perf_counter() - started,
            **predicted,
        }
    )
