"""`_layer_walk`: where two per-layer records first differ, and the layer
records of `tfdet locate --record` traces."""

from __future__ import annotations

import pytest

from tfdet._errors import RunFailedError
from tfdet._protocol import _result as _result_record
from tfdet._protocol._spec import LOCATE
from tfdet._record import _diff, _layer_walk, _trace


def _result(steps: list[dict]) -> dict:
    """A fake worker result as its JSON: dense_a -> noise -> head, variables
    in a and head."""
    return {
        "profile": {},
        "layers": [
            {"name": "dense_a", "class": "Dense", "scope": "m/dense_a", "tensors": [0, 1],
             "ops": ["MatMul"], "gradient_ops": ["MatMul"],
             "consumers": [1], "model_output": False},
            {"name": "noise", "class": "Noise", "scope": "m/noise", "tensors": [1, 2],
             "ops": ["AddV2"], "gradient_ops": [],
             "consumers": [2], "model_output": False},
            {"name": "head", "class": "Dense", "scope": "m/head", "tensors": [2, 3],
             "ops": ["MatMul"], "gradient_ops": ["MatMul", "BiasAddGrad"],
             "consumers": [], "model_output": True},
        ],
        "variables": ["dense_a/kernel", "head/kernel"],
        "variable_layers": [0, 2],
        "steps": steps,
    }  # fmt: skip


def _locate(a: dict, b: dict) -> _layer_walk.Location | None:
    """Where two fake results first differ, read as the runner reads them."""
    return _layer_walk.locate_results(
        _result_record.read(LOCATE, a), _result_record.read(LOCATE, b)
    )


def _step(step=0, outputs="abc", loss="1", out_grads="xyz", grads="gh", weights="wv"):
    return {
        "step": step,
        "outputs": list(outputs),
        "loss": {"dtype": "float32", "bits": loss},
        "output_gradients": list(out_grads),
        "gradients": list(grads),
        "weights": list(weights),
    }


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"outputs": "abX"}, ("forward", "head", "output")),
        ({"outputs": "aXX"}, ("forward", "noise", "output")),
        ({"loss": "2"}, ("loss", None, "loss")),
        ({"out_grads": "xyZ"}, ("backward", None, "loss gradient")),
        ({"grads": "gH"}, ("backward", "head", "gradient of head/kernel")),
        # The gradient reaching noise's output is computed by head's backprop.
        ({"out_grads": "xYz"}, ("backward", "head", "input gradient")),
        ({"grads": "Gh"}, ("backward", "dense_a", "gradient of dense_a/kernel")),
        ({"weights": "Wv"}, ("update", "dense_a", "update of dense_a/kernel")),
    ],
)
def test_walk_follows_execution_order(changes, expected):
    a = _result([_step(0), _step(1)])
    b = _result([_step(0), _step(1, **changes)])
    location = _locate(a, b)
    assert location.step == 1
    assert (location.phase, location.layer, location.quantity) == expected
    assert _locate(a, _result([_step(0), _step(1)])) is None


def _residual(steps: list[dict]) -> dict:
    """dense_a -> (dense_b, add), dense_b -> add -> head: a residual block."""
    result = _result(steps)
    dense_a, noise, head = result["layers"]
    result["layers"] = [
        dict(dense_a, consumers=[1, 2]),
        dict(noise, name="dense_b", consumers=[2]),
        dict(noise, name="add", tensors=[2, 3], consumers=[3]),
        dict(head, tensors=[3, 4]),
    ]
    result["variable_layers"] = [0, 3]
    return result


@pytest.mark.parametrize(
    ("out_grads", "layer", "quantity"),
    [
        # add's output gradient: computed by head alone.
        ("wxYz", "head", "input gradient"),
        # dense_b's: computed by add alone (not by the next layer in call order).
        ("wYyz", "add", "input gradient"),
        # dense_a's: the sum of dense_b's and add's input gradients.
        (
            "Wxyz",
            None,
            "gradient flowing into the output of 'dense_a', summed from its "
            "consumers 'dense_b', 'add'",
        ),
    ],
)
def test_walk_blames_the_consumers_of_a_branched_output(out_grads, layer, quantity):
    a = _residual([_step(0, outputs="abcd", out_grads="wxyz")])
    b = _residual([_step(0, outputs="abcd", out_grads=out_grads)])
    location = _locate(a, b)
    assert (location.phase, location.layer, location.quantity) == (
        "backward",
        layer,
        quantity,
    )


def test_walk_does_not_guess_without_consumers():
    a = _result([_step(0)])
    for layer in a["layers"]:
        del layer["consumers"], layer["model_output"]
    b = _result([_step(0, out_grads="xYz")])
    b["layers"] = a["layers"]
    location = _locate(a, b)
    assert location.layer is None
    assert location.quantity == (
        "gradient flowing into the output of 'noise' (computed by the layers that "
        "consume it)"
    )


def test_different_structures_are_a_failed_run():
    a = _result([_step(0)])
    b = _result([_step(0)])
    b["layers"] = b["layers"][:2]
    with pytest.raises(RunFailedError, match="same layers"):
        _locate(a, b)


def _write_record(path, result: dict) -> _trace.Trace:
    """`result` as `tfdet locate --record` writes it, read back."""
    header = _trace.make_header(
        None,
        None,
        result["variables"],
        training="locate",
        layers=result["layers"],
        variable_layers=result["variable_layers"],
    )
    with _trace.TraceWriter(path, header) as writer:
        for step in result["steps"]:
            writer.write_step(_layer_walk.trace_step(step, "".join(step["weights"])))
    return _trace.read(path)


def test_a_record_read_back_from_its_trace_is_the_record(tmp_path):
    result = _result([_step(0), _step(1, outputs="abX")])
    trace = _write_record(tmp_path / "record.jsonl", result)
    record = _layer_walk.from_trace(trace.header, trace.steps)
    assert record == _result_record.read(LOCATE, result)


def test_diff_of_two_records_names_the_layer_the_walk_names(tmp_path):
    a = _write_record(tmp_path / "a.jsonl", _result([_step(0), _step(1)]))
    b = _write_record(
        tmp_path / "b.jsonl", _result([_step(0), _step(1, grads="gH", weights="wV")])
    )
    comparison = _diff.compare(a, b)
    assert comparison.layers_compared and not comparison.identical
    location = comparison.layer_location
    assert (location["step"], location["phase"], location["layer"]) == (
        1,
        "backward",
        "head",
    )
    assert location["gradient_ops"] == ["MatMul", "BiasAddGrad"]
    same = _diff.compare(
        a, _write_record(tmp_path / "c.jsonl", _result([_step(0), _step(1)]))
    )
    assert same.identical and same.layers_compared and same.layer_location is None


def test_traces_without_layer_records_compare_no_layers(tmp_path):
    record = _write_record(tmp_path / "a.jsonl", _result([_step(0)]))
    plain = _trace.Trace(dict(record.header, layers=None), record.steps)
    assert _layer_walk.from_trace(plain.header, plain.steps) is None
    comparison = _diff.compare(record, plain)
    assert not comparison.layers_compared and comparison.layer_location is None
    # Records of other layers cannot be walked together: no layer verdict.
    other = _result([_step(0)])
    other["layers"] = other["layers"][:2]
    fewer = _write_record(tmp_path / "b.jsonl", other)
    assert not _diff.compare(record, fewer).layers_compared
