"""`tfdet locate`: the first layer whose bits differ between two processes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_tfdet
from tfdet._errors import RunFailedError
from tfdet._runs import _locate

TARGETS = str(REPO / "tests" / "targets" / "locate_models.py")


def _result(steps: list[dict]) -> dict:
    """A fake worker result: dense_a -> noise -> head, variables in a and head."""
    return {
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
    location = _locate.locate_results(a, b)
    assert location.step == 1
    assert (location.phase, location.layer, location.quantity) == expected
    assert _locate.locate_results(a, _result([_step(0), _step(1)])) is None


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
    location = _locate.locate_results(a, b)
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
    location = _locate.locate_results(a, b)
    assert location.layer is None
    assert location.quantity == (
        "gradient flowing into the output of 'noise' (computed by the layers that "
        "consume it)"
    )


def test_recorder_maps_each_output_to_its_consumers():
    tf = pytest.importorskip("tensorflow")
    from tests.targets import locate_models
    from tfdet._runs import _locate_worker

    def consumers(model) -> dict[str, list[str]]:
        recorder = _locate_worker._Recorder(model)

        @tf.function
        def forward(x):
            recorder.reset()
            y = model(x, training=True)
            recorder.model_outputs = tf.nest.flatten(y)
            return y

        forward(tf.zeros((2, locate_models.FEATURES)))
        names = [call["name"] for call in recorder.calls]
        outputs = recorder.feeds_model_output()
        return {
            names[i]: [names[c] for c in found] + ["(model output)"] * outputs[i]
            for i, found in enumerate(recorder.consumers())
        }

    assert consumers(locate_models.clean_residual()) == {
        "dense_a": ["dense_b", "add"],
        "dense_b": ["add"],
        "add": ["head"],
        "head": ["(model output)"],
    }
    # Nested block: the layer inside it consumes dense_a's output, not the block.
    nested = consumers(locate_models.urandom_functional())
    assert nested["dense_a"] == ["inner_dense"]
    assert nested["inner_noise"] == ["inner_after"]
    assert nested["block"] == ["head"]


def test_different_structures_are_a_failed_run():
    a = _result([_step(0)])
    b = _result([_step(0)])
    b["layers"] = b["layers"][:2]
    with pytest.raises(RunFailedError, match="same layers"):
        _locate.locate_results(a, b)


def _locate_cli(tmp_path, *args: str) -> tuple[int, dict | None, str]:
    report = tmp_path / "locate.json"
    result = run_tfdet("locate", *args, "--json", str(report), timeout=400)
    facts = json.loads(report.read_text()) if report.exists() else None
    return result.returncode, facts, result.stdout + result.stderr


def test_names_exactly_the_urandom_layer_in_a_sequential(tmp_path):
    code, facts, output = _locate_cli(
        tmp_path, f"{TARGETS}:urandom_sequential", "--perturb", "none", "--steps", "2"
    )
    assert code == 1, output
    location = facts["location"]
    assert (location["step"], location["phase"]) == (0, "forward")
    assert (location["layer"], location["layer_class"]) == (
        "urandom_noise",
        "UrandomNoise",
    )
    assert location["agreeing"] == ["dense_a", "dense_b"]
    assert location["ops"] == ["AddV2"]
    assert [layer["name"] for layer in facts["layers"]] == [
        "dense_a",
        "dense_b",
        "urandom_noise",
        "dense_c",
        "head",
    ]
    assert "first layer that differs: urandom_noise (UrandomNoise)" in output


def test_the_same_model_without_noise_is_identical(tmp_path):
    code, facts, output = _locate_cli(
        tmp_path, f"{TARGETS}:clean_sequential", "--perturb", "none", "--steps", "2"
    )
    assert code == 0, output
    assert facts["location"] is None and len(facts["layers"]) == 5
    assert "no difference" in output


@pytest.mark.parametrize(
    ("target", "layer", "agreeing"),
    [
        ("urandom_functional", "inner_noise", ["dense_a", "inner_dense"]),
        ("urandom_subclassed", "sub_noise", ["first"]),
    ],
)
def test_nested_and_subclassed_models(tmp_path, target, layer, agreeing):
    code, facts, output = _locate_cli(
        tmp_path, f"{TARGETS}:{target}", "--perturb", "none", "--steps", "1"
    )
    assert code == 1, output
    location = facts["location"]
    assert (location["phase"], location["layer"]) == ("forward", layer)
    assert location["agreeing"] == agreeing


def test_thread_count_without_tfdet_names_a_thread_dependent_layer(tmp_path, two_cpus):
    # Affinity 2 CPUs vs 1: TensorFlow's default pools follow it (2 vs 1 threads).
    code, facts, output = _locate_cli(
        tmp_path, "builtin:cnn", "--perturb", "affinity", "--no-enable", "--steps", "2"
    )
    assert code == 1, output
    location = facts["location"]
    assert location["step"] == 0
    # A layer with reductions whose split follows the thread count, not a
    # pooling, dropout or reshaping layer.
    assert location["layer_class"] in ("Conv2D", "Dense"), location
    assert {"Conv2DBackpropFilter", "MatMul"} & set(
        location["gradient_ops"] + location["ops"]
    )
    assert location["agreeing"], "the layers before it on the walk agree"

    # The same perturbation with tfdet.enable(): every layer bit-identical.
    code, facts, output = _locate_cli(
        tmp_path, "builtin:cnn", "--perturb", "affinity", "--steps", "2"
    )
    assert code == 0, output
    assert facts["location"] is None


def test_bad_input_exits_2(tmp_path):
    assert run_tfdet("locate", f"{TARGETS}:no_such_function").returncode == 2
    assert run_tfdet("locate", "--steps", "0").returncode == 2
    assert run_tfdet("locate", "--seed", "-1").returncode == 2
    assert run_tfdet("locate", "--threads", "0").returncode == 2
    assert run_tfdet("locate", "--perturb", "cosmic_rays").returncode == 2
    # Found out in the child (tf.compat.v1 graph mode): still bad input, not a crash.
    graph = run_tfdet(
        "locate",
        "builtin:keras_issue_tf_keras_graph",
        "--perturb",
        "none",
        "--steps",
        "1",
    )
    assert graph.returncode == 2, graph.stderr[-2000:]
    assert "train eagerly" in graph.stderr
