"""Batch invariance in a check: each sample's prediction, whatever its batch.

The `batch` perturbation asks each TARGET run to predict, after training,
every input its steps trained on: run 0 in one batch, in order; the other
runs in another (seeded) order, in batches of 1, 5 and 32 in turn, so each
sample is predicted beside other samples, alone, and at another place in
its batch. Each run reports one digest per sample (its outputs' bits), and
the check compares them sample by sample after the weights: a model whose
sample outputs follow their batch diverges at the first such sample, with
the batch it was in. Both sides (the child that predicts, the parent that
compares) use this module.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

from tfdet import _variables

if TYPE_CHECKING:
    from tfdet._protocol._result import CheckResult

# `_variables.PREDICT` values: how a run predicts.
WHOLE = "whole"
SPLIT = "split"
# Batch sizes of a SPLIT run, in turn: a sample alone, a few, a full batch.
SPLIT_SIZES = (1, 5, 32)
# The seed of a SPLIT run's order (any fixed one: both sides know it).
ORDER_SEED = 0


def requested() -> str | None:
    """How this process was asked to predict (`WHOLE`, `SPLIT`), or None."""
    mode = os.environ.get(_variables.PREDICT)
    return mode if mode in (WHOLE, SPLIT) else None


def batches(samples: int, mode: str) -> list[list[int]]:
    """The sample indices of each prediction batch, in the order predicted."""
    import numpy as np

    if mode == WHOLE:
        return [list(range(samples))]
    order = np.random.default_rng(ORDER_SEED).permutation(samples).tolist()
    chunks, start, turn = [], 0, 0
    while start < samples:
        size = SPLIT_SIZES[turn % len(SPLIT_SIZES)]
        chunks.append(order[start : start + size])
        start, turn = start + size, turn + 1
    return chunks


def _sample_digests(outputs: Any, count: int) -> list[str]:
    """sha256 of each sample's outputs (every output's row), 16 hex digits."""
    import numpy as np
    import tensorflow as tf

    rows = [np.asarray(output) for output in tf.nest.flatten(outputs)]
    digests = []
    for index in range(count):
        sha = hashlib.sha256()
        for row in rows:
            sha.update(np.ascontiguousarray(row[index]).tobytes())
        digests.append(sha.hexdigest()[:16])
    return digests


def predict(model: Any, inputs: Any, mode: str) -> dict[str, Any]:
    """Predicts `inputs` as `mode` says; the run's result facts.

    Returns:
        `{"predictions": [digest per sample, in the inputs' order],
        "prediction_batches": [[batch size, place in it] per sample]}`.
    """
    import numpy as np
    import tensorflow as tf

    samples = len(tf.nest.flatten(inputs)[0])
    digests: list[str] = [""] * samples
    places: list[list[int]] = [[0, 0]] * samples
    for chunk in batches(samples, mode):
        picked = tf.nest.map_structure(
            lambda array, rows=chunk: np.asarray(array)[rows], inputs
        )
        outputs = model.predict_on_batch(picked)
        for place, (index, digest) in enumerate(
            zip(chunk, _sample_digests(outputs, len(chunk)), strict=True)
        ):
            digests[index] = digest
            places[index] = [len(chunk), place]
    return {"predictions": digests, "prediction_batches": places}


def inputs_of(built: Any, steps: int) -> Any:
    """The inputs of a TARGET's first `steps` batches, as one array (or nest)."""
    import numpy as np
    import tensorflow as tf

    parts = [built.batch(step)[0] for step in range(steps)]
    return tf.nest.map_structure(
        lambda *arrays: np.concatenate([np.asarray(a) for a in arrays]), *parts
    )


def first_difference(
    result_a: CheckResult, result_b: CheckResult
) -> tuple[str, str, str] | None:
    """`(quantity, expected, received)` of the first sample predicted apart.

    None when either run did not predict, or when every sample has the same
    bits. The quantity names the sample and the batch each run put it in.
    """
    digests_a, digests_b = result_a.predictions, result_b.predictions
    batches_a, batches_b = result_a.prediction_batches, result_b.prediction_batches
    if not digests_a or not digests_b or batches_a is None or batches_b is None:
        return None
    for index, (a, b) in enumerate(zip(digests_a, digests_b, strict=False)):
        if a != b:
            size_a, _ = batches_a[index]
            size_b, place_b = batches_b[index]
            return (
                f"prediction of sample {index} (in a batch of {size_a}; then of "
                f"{size_b}, at place {place_b})",
                a,
                b,
            )
    return None
