"""Child side of `tfdet check`: train a TARGET and record every bit.

Started as `python -m tfdet._runs._worker SPEC_JSON` in a fresh process whose
environment the parent has already perturbed. It prints one progress line per
step on stdout (`tfdet-progress STEP TOTAL`) and records the run as a trace
(`spec["trace"]`, the format `tfdet.DeterminismCallback` writes and `tfdet
diff` reads: every step's loss and metric bits and weight fingerprints). The
final weights are saved (`.npz`) so that a divergence in the weights can be
shown element by element. Last, it writes a JSON result file (atomically: a
crashed run leaves no result, and is never counted as equal) that names the
trace, the weights file and each variable's exact final digest.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

PROGRESS_PREFIX = "tfdet-progress"


def _seed_without_tfdet(seed: int, legacy: bool, workers: int) -> None:
    """What a careful user does without tfdet: Keras' own seeding only."""
    import keras

    keras.utils.set_random_seed(seed)
    if legacy:
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
    elif workers > 1:
        # Keras 3 cannot train multi-worker at all without this fix
        # (keras-team/keras#20585); it changes which value Keras reads
        # shapes from, not the bits of any step.
        from tfdet.patches import keras_multi_worker

        keras_multi_worker.PATCH.install()


def _distribution(spec: dict[str, Any]) -> tuple[int, int]:
    """`(workers, replicas)` of a run (specs of older parents lack them)."""
    return spec.get("workers", 1), spec.get("replicas", 1)


def _strategy(spec: dict[str, Any]) -> Any:
    """The `tf.distribute` strategy of a distributed run, or None.

    Several workers: a `MultiWorkerMirroredStrategy` over the loopback
    cluster the parent put in `TF_CONFIG`. Several replicas: a
    `MirroredStrategy` over as many logical CPU devices, split from the one
    physical CPU before TensorFlow's runtime starts.
    """
    workers, replicas = _distribution(spec)
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
    try:
        logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
    except TypeError:  # tf_keras v1 (graph-mode) models have no return_dict.
        outputs = model.train_on_batch(x, y, sample_weight=weights)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        logs = dict(zip(model.metrics_names, outputs, strict=False))
    return dict(logs)


def report_progress(done: int, total: int) -> None:
    """Tells the parent (`tfdet._runs._spawn`) how far this run is."""
    print(f"{PROGRESS_PREFIX} {done} {total}", flush=True)


def enable(spec: dict[str, Any]) -> None:
    """`tfdet.enable()` with the run's seed, threads and ISA cap."""
    from tfdet._pin._enable import enable

    with warnings.catch_warnings():
        # The parent sets each run's PYTHONHASHSEED on purpose (it is one of
        # the perturbations); the warning would fill the stderr tail a failed
        # run is reported with.
        warnings.filterwarnings("ignore", "PYTHONHASHSEED", UserWarning)
        enable(spec["seed"], threads=spec["threads"], cpu_isa=spec["cpu_isa"])


def start(spec: dict[str, Any]) -> Any:
    """Seeds (with or without tfdet, as the spec says) and builds the TARGET.

    Shared by every worker, so that `check` and `locate` runs start the same way.

    Returns:
        The `tfdet._runs._target.Built` target.
    """
    from tfdet._pin import _cache_sizes, _versions
    from tfdet._runs import _target, _xla

    seed = spec["seed"]
    if spec["enable"]:
        enable(spec)
    else:
        _seed_without_tfdet(seed, _versions.uses_legacy_keras(), _distribution(spec)[0])
    # The `caches` perturbation: another CPU's cache sizes, before the first
    # matrix product sizes its blocks by this one's.
    _cache_sizes.imitate_if_requested()
    # After enable(), which must precede `import tensorflow` (oneDNN), and
    # before the TARGET compiles: what it asked of XLA.
    _xla.install()
    strategy = _strategy(spec)
    if strategy is None:
        return _target.build(spec["target"], seed=seed)
    # The TARGET builds and compiles its model under the strategy, as a
    # user's `with strategy.scope():` block does.
    with strategy.scope():
        return _target.build(spec["target"], seed=seed)


def run_facts(seed: int) -> dict[str, Any]:
    """The profile and environment facts every worker result carries."""
    from tfdet._pin import _enable, _environment

    return {
        "profile": _enable.observed_profile(seed).to_dict(),
        "environment": {
            "affinity": _environment.affinity(),
            "env": {
                name: os.environ.get(name)
                for name in _environment.DETERMINISM_VARIABLES
            },
        },
    }


def write_result(path: str, result: dict[str, Any]) -> None:
    """Writes `result` atomically: a crashed run leaves no result file."""
    partial = path + ".tmp"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(result, out)
    os.replace(partial, path)


def _train_on_batches(built: Any, spec: dict[str, Any]) -> None:
    """Trains one `train_on_batch` step at a time, recording each in the trace."""
    from tfdet._pin import _enable, _environment
    from tfdet._record import _bits, _trace

    model = built.model
    writer = None
    try:
        for step in range(spec["steps"]):
            logs = _train_step(model, *built.batch(step), built.sample_weight(step))
            if writer is None:
                # After the first step: a model may create its weights then.
                header = _trace.make_header(
                    _enable.observed_profile(spec["seed"]),
                    _environment.fingerprint(_enable.profile()),
                    _bits.variable_names(model.weights),
                    every=1,
                    variables_every=1,
                )
                writer = _trace.TraceWriter(spec["trace"], header)
            checksums = _bits.weight_checksums(model.weights)
            writer.write_step(_trace.step_record(step, logs, checksums))
            report_progress(step + 1, spec["steps"])
    finally:
        if writer is not None:
            writer.close()


def _fit_distributed(built: Any, spec: dict[str, Any]) -> None:
    """Trains with `model.fit` under the model's strategy, as users do.

    The TARGET's batches for `spec["steps"]` steps become one `tf.data`
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
    from tfdet._runs import _target

    model, steps = built.model, spec["steps"]
    batches = [(*built.batch(step), built.sample_weight(step)) for step in range(steps)]
    sizes = sorted({_target.num_samples(batch[0]) for batch in batches})
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
            _callback.DeterminismCallback(spec["trace"]),
            # tf.keras is the Keras the model was built with (tf_keras or 3).
            tf.keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs: report_progress(batch + 1, steps)
            ),
        ],
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Trains `spec["target"]` for `spec["steps"]` steps and records the bits.

    Args:
        spec: target, seed, steps, enable, threads, cpu_isa, workers,
            replicas, result, trace (the paths of the result and trace files).

    Returns:
        The result dict (also written to `spec["result"]`).
    """
    import numpy as np

    from tfdet._record import _bits
    from tfdet._runs import _xla

    started = time.perf_counter()
    built = start(spec)
    model = built.model
    facts = run_facts(spec["seed"])
    if _distribution(spec) != (1, 1):
        _fit_distributed(built, spec)
        entry_point = "fit"
    else:
        _train_on_batches(built, spec)
        entry_point = "train_on_batch"
    final = model.get_weights()
    final_weights = _bits.weights_digests(model.weights, final)
    weights_path = spec["result"] + ".npz"
    np.savez(weights_path, *final)
    result = {
        **facts,
        "variables": list(final_weights),
        "trace": spec["trace"],
        "steps_recorded": spec["steps"],
        "final_weights": final_weights,
        "weights_file": weights_path,
        "synthesized_data": built.synthesized,
        # What ran: the entry point tfdet drove, and whether XLA compiled it.
        "entry_points": [entry_point],
        "xla": _xla.facts([model]),
        "seconds": time.perf_counter() - started,
    }
    write_result(spec["result"], result)
    return result


def main(argv: list[str]) -> int:
    run(json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
