"""Keras drops `jit_compile=True` under op determinism: tfdet says so."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_python, run_tfdet
from tfdet._child import _xla
from tfdet._errors import EXIT_OK

TARGETS = REPO / "tests" / "targets" / "xla_models.py"


def test_compile_hook_warns_once_when_determinism_drops_xla():
    proc = run_python(
        """
        import json, warnings
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tfdet._child import _xla
        _xla.install()
        import keras
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
                model.compile(optimizer="sgd", loss="mse", jit_compile=True)
            plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            plain.compile(optimizer="sgd", loss="mse")
        notices = [w for w in caught if "tfdet: jit_compile=True" in str(w.message)]
        print(json.dumps({"notices": len(notices), **_xla.facts([model, plain])}))
        """
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["notices"] == 1
    assert [c["dropped_by_determinism"] for c in facts["compiled"]] == [
        True,
        True,
        False,
    ]
    assert facts["on"] is False
    assert facts["notice"] == _xla.NOTICE


def test_compile_hook_is_silent_without_determinism():
    # The same model keeps XLA when op determinism is off: the notice is
    # about determinism, not about the model.
    proc = run_python(
        """
        import json
        from tfdet._child import _xla
        _xla.install()
        import keras
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
        print(json.dumps(_xla.facts([model])))
        """
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["on"] is True
    assert facts["notice"] is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "enable", "xla_on"),
    [
        # tfdet keeps XLA where a deterministic XLA path exists...
        ("jit_max_pool", True, True),
        # ...and says so where it does not (MaxPool3DGrad has none).
        ("jit_max_pool_3d", True, False),
        ("jit_dense", False, True),
    ],
    ids=["enable-max-pool-2d", "enable-max-pool-3d", "no-enable"],
)
def test_check_reports_what_ran_and_xla(tmp_path, target, enable, xla_on):
    report_path = tmp_path / "report.json"
    flags = [] if enable else ["--no-enable"]
    proc = run_tfdet(
        "check", f"{TARGETS}:{target}", "--device", "cpu", "--perturb", "none",
        "--steps", "2", "--json", str(report_path), *flags,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_OK, output
    runs = json.loads(report_path.read_text())["devices"]["cpu"]["runs"]
    dropped = enable and not xla_on
    for run in runs:
        assert run["entry_points"] == ["train_on_batch"]
        assert run["steps_recorded"] == 2
        assert run["xla"]["on"] is xla_on
        assert run["xla"]["dropped_by_determinism"] is dropped
    assert "ran: 2 steps via train_on_batch; XLA " + ("on" if xla_on else "off") in (
        output
    )
    assert output.count("jit_compile=True was turned off by Keras") == int(dropped)
