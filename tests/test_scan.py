"""`tfdet scan`: hazards of real training steps, attributed, in fresh CLI processes.

The models in `tests/targets/hazard_models.py` reach every entry point of
the GPU hazard table (TF 2.21). Without tfdet (`--no-enable`) the scan must list exactly
those hazards, each with the layer, metric or optimizer it comes from, and
exit 1; with tfdet's patches it must list none and exit 0. The same models
must train bit-identically across processes in `tfdet check`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, last_json_line, run_python, run_tfdet

MODELS = str(REPO / "tests" / "targets" / "hazard_models.py")
LEGACY = clean_env(TF_USE_LEGACY_KERAS="1")

# (op type, kind, source): what the training step of each model reaches.
KERAS3_HAZARDS = {
    ("DenseBincount", "layer", "counts"),
    ("ResizeNearestNeighborGrad", "layer", "resize"),
    ("ScatterNd", "metric", "iou"),
}
TF_KERAS_HAZARDS = KERAS3_HAZARDS | {
    ("ResizeNearestNeighborGrad", "layer", "upsample"),
    ("AdjustContrastv2", "layer", "contrast"),
    ("FusedBatchNormGradV3", "layer", "frozen_bn"),
    ("ResourceScatterAdd", "optimizer", "Adam"),
}
# Ops whose CPU bits depend on the CPU model (portable_* patches): Keras 3's
# BatchNormalization takes an Rsqrt, both Kerases' softmax head a Softmax.
KERAS3_CPU = {("Rsqrt", "layer", "frozen_bn"), ("Softmax", "layer", "head")}
TF_KERAS_CPU = {("Softmax", "layer", "head")}
# Entry points that Keras 3 already keeps off refused ops (measured on TF 2.21).
KERAS3_SAFE_LAYERS = {"upsample", "contrast", "frozen_bn"}


def scan(tmp_path: Path, target: str, *flags: str, env=None) -> tuple[int, dict, str]:
    report = tmp_path / "scan.json"
    result = run_tfdet("scan", target, *flags, "--json", str(report), env=env)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result.returncode, json.loads(report.read_text()), result.stdout


def keyed(findings: list[dict]) -> set[tuple[str, str, str]]:
    return {(f["op_type"], f["kind"], f["source"]) for f in findings}


def test_keras3_without_tfdet_lists_each_hazard_with_its_source(tmp_path: Path) -> None:
    code, report, stdout = scan(tmp_path, f"{MODELS}:keras3", "--no-enable")
    assert code == 1
    assert not report["enabled"] and report["patches"] == []
    assert keyed(report["findings"]) == KERAS3_HAZARDS | KERAS3_CPU
    gpu = [f for f in report["findings"] if f["device"] != "CPU"]
    gradient = {f["op_type"]: f["gradient"] for f in gpu}
    assert gradient == {
        "DenseBincount": False,
        "ResizeNearestNeighborGrad": True,
        "ScatterNd": False,
    }
    assert not {f["source"] for f in gpu} & KERAS3_SAFE_LAYERS
    for finding in report["findings"]:
        assert finding["patch"] and not finding["patch_installed"]
    assert "layer counts (CategoryEncoding)" in stdout
    assert "metric iou (MeanIoU)" in stdout


def test_keras3_with_tfdet_lists_none_and_says_what_patches_covered(
    tmp_path: Path,
) -> None:
    code, report, stdout = scan(tmp_path, f"{MODELS}:keras3")
    assert code == 0, stdout
    assert report["enabled"] and report["findings"] == []
    assert keyed(report["covered"]) == KERAS3_HAZARDS | KERAS3_CPU
    assert {"bincount", "resize_nearest_grad", "confusion_matrix_scatter"} <= set(
        report["patches"]
    )
    assert "GPU hazards under op determinism: none" in stdout


@pytest.mark.tf_keras
def test_tf_keras_without_tfdet_lists_each_hazard_with_its_source(
    tmp_path: Path,
) -> None:
    code, report, stdout = scan(
        tmp_path, f"{MODELS}:tf_keras", "--no-enable", env=LEGACY
    )
    assert code == 1
    assert report["keras"] == "tf_keras"
    assert keyed(report["findings"]) == TF_KERAS_HAZARDS | TF_KERAS_CPU
    frozen = [f for f in report["findings"] if f["op_type"] == "FusedBatchNormGradV3"]
    assert frozen[0]["gradient"] and frozen[0]["behaviour"] == "raises"
    assert "optimizer Adam" in stdout and "layer upsample (UpSampling2D)" in stdout


@pytest.mark.tf_keras
def test_tf_keras_with_tfdet_lists_none(tmp_path: Path) -> None:
    code, report, stdout = scan(tmp_path, f"{MODELS}:tf_keras", env=LEGACY)
    assert code == 0, stdout
    assert report["findings"] == []
    assert keyed(report["covered"]) == TF_KERAS_HAZARDS | TF_KERAS_CPU
    assert "sparse_optimizer_update" in report["patches"]


def test_hazard_in_a_nested_gradient_function_is_found_and_attributed(
    tmp_path: Path,
) -> None:
    code, report, _ = scan(tmp_path, f"{MODELS}:nested", "--no-enable")
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["op_type"], finding["kind"], finding["source"]) == (
        "ResizeNearestNeighborGrad",
        "layer",
        "nested_resize",
    )
    assert finding["gradient"] and report["functions"] >= 1
    code, report, _ = scan(tmp_path, f"{MODELS}:nested")
    assert code == 0 and report["findings"] == []


def test_crop_and_resize_and_sparse_matmul_backprops_are_found_and_patched(
    tmp_path: Path,
) -> None:
    code, report, _ = scan(tmp_path, f"{MODELS}:extras", "--no-enable")
    assert code == 1
    found = {(f["op_type"], f["source"], f["gradient"]) for f in report["findings"]}
    assert found == {
        ("CropAndResizeGradImage", "roi_crop", True),
        ("CropAndResizeGradBoxes", "roi_crop", True),
        ("SparseTensorDenseMatMul", "graph_conv", False),
        ("SparseTensorDenseMatMul", "graph_conv", True),
    }
    code, report, _ = scan(tmp_path, f"{MODELS}:extras")
    assert code == 0 and report["findings"] == []
    assert len(report["covered"]) == 4


CUDNN_OPS = {"CudnnRNNV3", "CudnnRNNBackpropV3"}


@pytest.mark.parametrize(
    ("target", "env"),
    [
        ("recurrent_keras3", None),
        pytest.param("recurrent_tf_keras", LEGACY, marks=pytest.mark.tf_keras),
    ],
    ids=["keras3", "tf_keras"],
)
def test_cudnn_lstm_and_gru_are_found_on_a_cpu_and_are_no_hazard(
    tmp_path: Path, target: str, env
) -> None:
    # No GPU here: Keras 3 must be traced as a GPU would run it, and tf_keras'
    # cuDNN twins (registered, never called) walked. cuDNN's RNN repeats its
    # bits under op determinism (measured on a GPU): the table marks it
    # deterministic, so the scan names it as checked, and tfdet keeps it.
    for flags in (("--no-enable",), ()):
        code, report, stdout = scan(tmp_path, f"{MODELS}:{target}", *flags, env=env)
        assert code == 0, stdout
        assert report["findings"] == []
        # Keras 3 and tf_keras 2.21 trace CudnnRNNV3, tf_keras 2.16 CudnnRNN.
        cudnn = {op for op in report["deterministic_ops"] if op.startswith("CudnnRNN")}
        assert any("Backprop" in op for op in cudnn), report["deterministic_ops"]
        assert any("Backprop" not in op for op in cudnn), report["deterministic_ops"]
        assert "cudnn_rnn" not in report["patches"]


def test_builtin_cnn_is_clean_and_the_report_says_what_was_checked(
    tmp_path: Path,
) -> None:
    code, report, stdout = scan(tmp_path, "builtin:cnn")
    assert code == 0
    assert report["findings"] == []
    assert report["ops_checked"] > 100
    # Forward, backward, optimizer and metric ops were all walked.
    assert {
        "Conv2D",
        "Conv2DBackpropFilter",
        "MaxPoolGrad",
        "MatMul",
        "AssignSubVariableOp",
    } <= set(report["op_types"])
    assert "MaxPoolGrad" in report["deterministic_ops"]
    assert (
        f"checked {report['ops_checked']} ops of {len(report['op_types'])} types"
        in stdout
    )
    assert "op types checked: " in stdout and "Conv2DBackpropFilter" in stdout


@pytest.mark.parametrize(
    "target", ["no_such_module_xyz:build", "builtin:nope", "missing.py:f"]
)
def test_bad_target_exits_2(target: str) -> None:
    result = run_tfdet("scan", target, "--no-enable")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "TARGET" in result.stderr or "target" in result.stderr


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
@pytest.mark.parametrize("enable", [True, False], ids=["enable", "no-enable"])
def test_seed_out_of_range_is_a_usage_error(seed: str, enable: bool) -> None:
    flags = [] if enable else ["--no-enable"]
    result = run_tfdet("scan", "builtin:cnn", *flags, "--seed", seed)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "Expected --seed" in result.stderr
    assert f"Received: seed={seed}" in result.stderr


def test_scan_hides_gpus_before_tensorflow_starts() -> None:
    # No GPU here: a spy shows the scan asks TensorFlow for no visible GPU
    # before the runtime starts, which is what keeps its warm-up step (real
    # ops under determinism) on the CPU on a GPU machine.
    result = run_python(
        """
        import json
        import tensorflow as tf
        from tensorflow.python.eager import context

        calls = []
        original = tf.config.set_visible_devices

        def spy(devices, device_type=None):
            calls.append([list(devices), device_type, context.context()._initialized])
            return original(devices, device_type)

        tf.config.set_visible_devices = spy
        from tfdet._cli import main

        code = main(["tfdet", "scan", "builtin:cnn", "--no-enable"])
        print(json.dumps({
            "code": code,
            "calls": calls,
            "visible_gpus": [d.name for d in tf.config.get_visible_devices("GPU")],
        }))
        """,
        env=clean_env(PYTHONHASHSEED="0"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = last_json_line(result.stdout)
    # 1: unpatched, the CNN's softmax head is a CPU-model-dependent op.
    assert out["code"] == 1
    assert out["calls"] == [[[], "GPU", False]]  # Before the runtime started.
    assert out["visible_gpus"] == []


def test_max_pooling_under_xla_has_no_blocking_op_once_patched(tmp_path: Path) -> None:
    # jit_compile=True is kept under tfdet.enable() (keras_xla_determinism),
    # so the step is traced for XLA; its MaxPool gradient is the patch's.
    target = f"{REPO / 'tests' / 'targets' / 'xla_models.py'}:jit_max_pool"
    code, report, stdout = scan(tmp_path, target)
    assert code == 0, stdout
    assert report["findings"] == []
    assert "MaxPoolGrad" not in report["op_types"]
    assert {"LogicalAnd", "PadV2"} <= set(report["op_types"])  # The patch's form.
    assert {"xla_max_pool_grad", "keras_xla_determinism"} <= set(report["patches"])
    assert report["xla_dropped"] is False


def test_scan_names_what_keeps_keras_from_xla_under_determinism(tmp_path: Path) -> None:
    # MaxPooling3D's gradient has no deterministic XLA form, so Keras drops
    # the model's jit_compile=True; the scan traces for XLA anyway to say why.
    target = f"{REPO / 'tests' / 'targets' / 'xla_models.py'}:jit_conv_max_pool_3d"
    code, report, stdout = scan(tmp_path, target)
    assert code == 1, stdout
    assert report["xla_dropped"] is True
    (finding,) = report["findings"]
    assert finding["op_type"] == "MaxPool3DGrad"
    assert finding["behaviour"] == "xla_compile_error"
    assert finding["source"] == "max_pooling3d"
    assert "Keras turned it off under op determinism" in stdout


def test_scan_help_says_it_runs_on_the_cpu() -> None:
    result = run_tfdet("scan", "--help")
    assert result.returncode == 0
    assert "GPU is hidden" in " ".join(result.stdout.split())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "env", "patches"),
    [
        (
            "keras3",
            None,
            {"bincount", "resize_nearest_grad", "confusion_matrix_scatter"},
        ),
        ("recurrent_keras3", None, set()),
        pytest.param("recurrent_tf_keras", LEGACY, set(), marks=pytest.mark.tf_keras),
        pytest.param(
            "tf_keras",
            LEGACY,
            {
                "adjust_contrast",
                "bincount",
                "confusion_matrix_scatter",
                "fused_batch_norm_frozen",
                "resize_nearest_grad",
                "sparse_optimizer_update",
            },
            marks=pytest.mark.tf_keras,
        ),
    ],
)
def test_patched_models_train_bit_identically_in_check(
    tmp_path: Path, target, env, patches
) -> None:
    report_path = tmp_path / "check.json"
    result = run_tfdet(
        "check",
        f"{MODELS}:{target}",
        "--steps",
        "3",
        "--json",
        str(report_path),
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(report_path.read_text())
    runs = report["devices"]["cpu"]["runs"]
    assert len(runs) >= 2 and all(run["ok"] for run in runs)
    for run in runs:
        assert patches <= set(run["profile"]["patches"])


# The scan's attribution of every cuDNN node of a TARGET's traced step:
# `[op type, source, source type, node name]` rows (cuDNN is no hazard, so
# the report itself no longer lists these nodes).
CUDNN_ATTRIBUTION = """
import json
from tfdet._graph import _layers, _scan
from tfdet._target import _load
built = _load.build(TARGET)
_scan._warm_up(built)
calls = _layers.CallRecord()
graph_def, xla = _scan.trace_train_step(built.model, *built.batch(0), calls)
attributor = _scan.Attributor(built.model, calls)
print(json.dumps([
    [node.op_type, *attributor.attribute(node.name)[1:3], node.name]
    for node in _scan.walk(graph_def, xla=xla)
    if node.op_type.startswith("CudnnRNN")
]))
"""


def test_bidirectional_lstm_ops_are_not_blamed_on_the_gru_wrapper() -> None:
    # The LSTM wrapper's ops live in TF scope `bidirectional_1`, the Keras name
    # of the GRU wrapper: matching names blamed the GRU and lost the LSTM.
    target = f"{MODELS}:bidirectional_keras3"
    result = run_python(CUDNN_ATTRIBUTION.replace("TARGET", repr(target)))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert {tuple(row[:3]) for row in rows} == {
        (op_type, f"{wrapper}/{direction}_{rnn.lower()}", rnn)
        for op_type in CUDNN_OPS
        for wrapper, rnn in (("bidirectional", "LSTM"), ("bidirectional_1", "GRU"))
        for direction in ("forward", "backward")
    }
    # The collision this guards against is present in the traced graph.
    assert any("/bidirectional_1/" in row[3] for row in rows if row[2] == "LSTM")
