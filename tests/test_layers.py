"""`tfdet._graph._layers`: the layer tree walk and the record of which layer's call built each op."""

from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tfdet._graph import _layers  # noqa: E402


def _nested_model():
    inner = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, name="inner_dense")], name="block"
    )
    x = keras.Input((3,))
    y = keras.layers.Dense(2, name="shared")(inner(x))
    return keras.Model(x, y, name="outer"), inner


def test_children_descendants_and_paths_follow_nesting() -> None:
    model, inner = _nested_model()
    assert [layer.name for layer in _layers.children(model)][-2:] == ["block", "shared"]
    names = {layer.name for layer in _layers.descendants(model)}
    assert {"block", "inner_dense", "shared"} <= names
    paths = {path for _, path in _layers.paths(model).values()}
    assert {"block", "block/inner_dense", "shared"} <= paths
    assert "inner_dense" not in paths  # A nested layer is named by its path.


def test_call_record_prefers_the_longest_recorded_prefix() -> None:
    record = _layers.CallRecord()
    outer, inner = object(), object()
    record.scopes["model/outer"] = outer
    record.scopes["model/outer/inner"] = inner
    record.ops["model/outer/Call"] = inner
    assert record.layer_for(["model", "outer", "inner", "MatMul"]) is inner
    assert record.layer_for(["model", "outer", "Add"]) is outer
    assert record.layer_for(["model", "outer", "Call", "body", "X"]) is inner
    assert record.layer_for(["model", "other"]) is None
    assert record.layer_for([]) is None


def test_record_calls_maps_ops_to_the_innermost_layer_and_restores_call() -> None:
    model, inner = _nested_model()
    inner_dense = inner.get_layer("inner_dense")
    shared = model.get_layer("shared")
    before = type(shared).__call__
    with _layers.record_calls(model) as record:
        assert type(shared).__call__ is not before
        tf.function(model).get_concrete_function(tf.TensorSpec((None, 3)))
    assert type(shared).__call__ is before
    owners = {}
    for name, layer in record.ops.items():
        owners.setdefault(layer.name, []).append(name)
    assert set(owners) == {"inner_dense", "shared"}  # `block` built no op itself.
    assert any("MatMul" in name for name in owners["inner_dense"])
    assert all(record.ops[name] is inner_dense for name in owners["inner_dense"])
    assert any(layer is shared for layer in record.scopes.values())


def test_record_calls_ignores_layers_of_other_models() -> None:
    model, _ = _nested_model()
    other = keras.layers.Dense(2, name="elsewhere")
    with _layers.record_calls(model) as record:
        tf.function(other).get_concrete_function(tf.TensorSpec((None, 3)))
    assert record.ops == {}
