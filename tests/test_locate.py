"""`tfdet locate`: the first layer whose bits differ between two processes,
and `--record`, its layer record as a trace that `tfdet diff` compares."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_tfdet
from tfdet._record import _trace

TARGETS = str(REPO / "tests" / "targets" / "locate_models.py")


def test_recorder_maps_each_output_to_its_consumers():
    tf = pytest.importorskip("tensorflow")
    from tests.targets import locate_models
    from tfdet._child import _locate_worker

    def consumers(model) -> dict[str, list[str]]:
        recorder = _locate_worker._LayerOutputs(model)

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


def test_a_recurrent_model_is_recorded_at_the_layer_that_runs_its_loop(tmp_path):
    # An LSTM runs its cell once per time step inside a while loop, whose
    # tensors cannot leave it: recording the cell's outputs failed every run
    # of a model with an LSTM or GRU (exit 3, TensorFlow's traceback).
    survey = REPO / "benchmarks" / "survey_models.py"
    code, facts, output = _locate_cli(
        tmp_path, f"{survey}:lstm", "--perturb", "none", "--steps", "1"
    )
    assert code == 0, output
    # The cell's call outside the loop (Keras runs the first time step there)
    # and the LSTM itself are recorded; the cell's calls inside it are not.
    classes = [layer["class"] for layer in facts["layers"]]
    assert classes == ["LSTMCell", "LSTM", "Dense"]


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


def _record(tmp_path, target: str, name: str) -> str:
    path = str(tmp_path / name)
    code, facts, output = _locate_cli(
        tmp_path, f"{TARGETS}:{target}", "--steps", "1", "--record", path
    )
    assert code == 0, output
    assert facts["record"] == path and facts["steps"] == 1
    return path


def test_records_from_two_processes_diff_down_to_the_layer(tmp_path):
    # Each record is one process: two records stand for two machines here
    # (the urandom layer differs between any two processes).
    a = _record(tmp_path, "urandom_sequential", "a.jsonl")
    b = _record(tmp_path, "urandom_sequential", "b.jsonl")
    header = _trace.read(a).header
    assert header["environment"]["cpu_model"]  # What two machines would differ in.
    assert [layer["name"] for layer in header["layers"]][2] == "urandom_noise"
    result = run_tfdet("diff", a, b, "--json", str(tmp_path / "diff.json"))
    assert result.returncode == 1, result.stdout + result.stderr
    location = json.loads((tmp_path / "diff.json").read_text())["layer_location"]
    assert (location["step"], location["phase"], location["layer"]) == (
        0,
        "forward",
        "urandom_noise",
    )
    assert "first layer that differs: urandom_noise (UrandomNoise)" in result.stdout
    assert "TensorFlow ops (forward): AddV2" in result.stdout

    c = _record(tmp_path, "clean_sequential", "c.jsonl")
    d = _record(tmp_path, "clean_sequential", "d.jsonl")
    result = run_tfdet("diff", c, d)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every layer bit-identical" in result.stdout


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
