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


def _seed_without_tfdet(seed: int, legacy: bool) -> None:
    """What a careful user does without tfdet: Keras' own seeding only."""
    import keras

    keras.utils.set_random_seed(seed)
    if legacy:
        import tf_keras

        tf_keras.utils.set_random_seed(seed)


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


def start(spec: dict[str, Any]) -> Any:
    """Seeds (with or without tfdet, as the spec says) and builds the TARGET.

    Shared by every worker, so that `check` and `locate` runs start the same way.

    Returns:
        The `tfdet._runs._target.Built` target.
    """
    import tfdet
    from tfdet._pin import _versions
    from tfdet._runs import _target, _xla

    seed = spec["seed"]
    if spec["enable"]:
        with warnings.catch_warnings():
            # The parent sets each run's PYTHONHASHSEED on purpose (it is one
            # of the perturbations); the warning would fill the stderr tail
            # a failed run is reported with.
            warnings.filterwarnings("ignore", "PYTHONHASHSEED", UserWarning)
            tfdet.enable(seed, threads=spec["threads"], cpu_isa=spec["cpu_isa"])
    else:
        _seed_without_tfdet(seed, _versions.uses_legacy_keras())
    # After enable(), which must precede `import tensorflow` (oneDNN), and
    # before the TARGET compiles: what it asked of XLA.
    _xla.install()
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


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Trains `spec["target"]` for `spec["steps"]` steps and records the bits.

    Args:
        spec: target, seed, steps, enable, threads, cpu_isa, result, trace
            (the paths of the result and trace files).

    Returns:
        The result dict (also written to `spec["result"]`).
    """
    import numpy as np

    from tfdet._pin import _enable, _environment
    from tfdet._record import _bits, _trace
    from tfdet._runs import _xla

    started = time.perf_counter()
    built = start(spec)
    model = built.model
    facts = run_facts(spec["seed"])
    writer = None
    try:
        for step in range(spec["steps"]):
            logs = _train_step(model, *built.batch(step), built.sample_weight(step))
            if writer is None:
                # After the first step: a model may create its weights then.
                header = _trace.make_header(
                    _enable.observed_profile(spec["seed"]),
                    _environment.fingerprint(),
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
        "entry_points": ["train_on_batch"],
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
