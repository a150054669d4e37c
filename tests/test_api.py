"""`tfdet.check()`: the check from Python, as a notebook user calls it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import threading
import types

import pytest

import tfdet
from tests.conftest import clean_env, last_json_line, run_python, run_tfdet
from tfdet._commands import _api, _options
from tfdet._errors import TargetError
from tfdet._pin import _settings

# Defined in `python -c` code: no file, no source for `inspect`. The globals
# it reads (a module, a constant, a helper of the same script) go with it.
_MODEL = """
import numpy as np

N = 6


def data():
    return np.random.default_rng(0).standard_normal((64, N)).astype("float32")


def build():
    import keras
    x = data()
    model = keras.Sequential(
        [keras.Input((N,)), keras.layers.Dense(4), keras.layers.Dense(2)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model, x, x[:, :2]
"""

_SESSION = (
    _MODEL
    + """
import json, os, sys
import tfdet


def noisy():
    import keras
    keras.utils.set_random_seed(int.from_bytes(os.urandom(4), "little"))
    model = keras.Sequential([keras.Input((N,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


options = dict(steps=2, device="cpu", perturb="hashseed", attribute=False)
good = tfdet.check(build, **options)
bad = tfdet.check(noisy, **options)
print(json.dumps({
    "tensorflow_in_parent": "tensorflow" in sys.modules,
    "good": [good.verdict, good.exit_code, [r.final_loss for r in good.runs],
             good.to_dict()["target"], good.divergence],
    "bad": [bad.verdict, bad.exit_code, bad.divergence.step,
            bad.divergence.device, bad.divergence.quantity],
    "json_keys": sorted(good.to_dict()),
    "printed": [str(good), str(bad)],
}))
"""
)


def test_check_from_a_python_c_session_agrees_with_the_cli(tmp_path):
    result = run_python(_SESSION, env=clean_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    facts = last_json_line(result.stdout)
    verdict, code, losses, target, divergence = facts["good"]
    assert (verdict, code, divergence) == ("identical", 0, None)
    assert target == "__main__:build"
    assert len(losses) == 2 and losses[0] == losses[1]
    # An os.urandom seed: the same API says "diverged", with the CLI's code,
    # and where, as attributes of a typed report.
    verdict, code, step, device, quantity = facts["bad"]
    assert (verdict, code, step, device) == ("diverged", 1, 0, "cpu")
    assert quantity == "loss" or quantity.startswith("weights"), quantity
    # print(report) and a notebook cell: the verdict first, not every field.
    good_text, bad_text = facts["printed"]
    assert good_text.startswith("tfdet check __main__:build: IDENTICAL (exit 0)")
    assert bad_text.splitlines()[0].endswith(
        ": DIVERGED (exit 1); 2 runs x 2 steps, with tfdet.enable()"
    )
    assert "first divergence: " in bad_text and len(bad_text.splitlines()) < 8
    # The same model through the CLI: the same verdict and the same bits.
    (tmp_path / "model.py").write_text(_MODEL)
    cli = run_tfdet(
        "check",
        f"{tmp_path / 'model.py'}:build",
        *("--steps", "2", "--device", "cpu", "--perturb", "hashseed"),
        *("--no-attribute", "--json", "-"),
    )
    assert cli.returncode == 0, cli.stderr[-4000:]
    report = json.loads(cli.stdout)
    assert report["verdict"] == "identical"
    assert [float(r["final_loss"]) for r in report["devices"]["cpu"]["runs"]] == losses
    # to_dict() is the --json report: the same keys.
    assert facts["json_keys"] == sorted(report)


def test_signature_takes_its_defaults_from_run_options():
    parameters = inspect.signature(tfdet.check).parameters
    for field in dataclasses.fields(_options.RunOptions):
        if field.name != "target":
            assert parameters[field.name].default == field.default, field.name
    assert parameters["seed"].default == _settings.DEFAULT_SEED
    assert parameters["runs"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="Received: step="):
        tfdet.check("builtin:cnn", step=3)
    with pytest.raises(ValueError, match="`runs` >= 2. Received: runs=1") as error:
        tfdet.check("builtin:cnn", runs=1)
    assert "--" not in str(error.value)  # Python names for Python callers.


_LOCK = threading.Lock()


def _uses_a_lock():
    return _LOCK


def test_callables_that_cannot_travel_are_refused_with_what_to_do():
    def outer():
        size = 3

        def build():
            return size

        return build

    with pytest.raises(TargetError, match="reads size.*top level"):
        tfdet.check(outer())

    with pytest.raises(TargetError, match="_LOCK=lock.*inside the function"):
        _api._module_source(_uses_a_lock)
    with pytest.raises(TargetError, match="a TARGET string or a function"):
        tfdet.check(3)
    # A partial of a function defined here (not importable by name): refused
    # with the wrapper to write, not an AttributeError from inside tfdet.
    with pytest.raises(TargetError, match="a partial. Wrap it: `def build"):
        tfdet.check(functools.partial(_uses_a_lock))


def test_an_importable_function_is_passed_by_name():
    from tfdet._target import _builtins

    assert _api._importable_name(_builtins.get("cnn").function) is not None
    assert _api._importable_name(lambda: None) is None


def test_a_function_of_a_module_found_through_a_run_time_sys_path_entry(tmp_path):
    # The notebook pattern: `sys.path.insert(0, "src")`, then `import models`.
    # A fresh process does not have that entry, so the runs get the module by
    # its file; the report still names the function as the user knows it.
    source = tmp_path / "src"
    source.mkdir()
    (source / "notebook_models.py").write_text(_MODEL)
    code = f"""
import json, os, sys
os.chdir({str(tmp_path)!r})
sys.path.insert(0, "src")
import notebook_models
import tfdet
report = tfdet.check(notebook_models.build, steps=1, perturb="hashseed", attribute=False)
print(json.dumps({{"verdict": report.verdict, "target": report.to_dict()["target"]}}))
"""
    result = run_python(code, env=clean_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert last_json_line(result.stdout) == {
        "verdict": "identical",
        "target": "notebook_models:build",
    }
    # A module of a package keeps its name (its relative imports need it).
    assert _api._by_path(_api._by_path) is None


def test_a_printed_script_report_says_its_verdict_and_cause_first():
    from tfdet._commands._script_report import ScriptCheckReport, ScriptDivergence

    divergence = ScriptDivergence(
        training="fit #1 (model sequential)",
        found={"step": 0, "quantity": "loss"},
        description="step 0: loss 0.5 vs 0.25",
        runs=(0, 1),
    )
    report = ScriptCheckReport(
        script="train.py", args=(), enable=True, seed=0, threads=1,
        runs_per_check=2, max_steps=None, perturbations=("hashseed",),
        perturbations_skipped={}, run_reports=(), divergence=divergence,
        nothing_trained=False, shared_writes=(), notices=(), exit_code=1,
    )  # fmt: skip
    assert str(report).splitlines() == [
        "tfdet check --script train.py: DIVERGED (exit 1); 2 runs, with tfdet.enable()",
        "  first divergence: step 0: loss 0.5 vs 0.25",
    ]


def _returns_none():
    return None


def test_a_bad_function_is_named_in_the_error_not_tfdets_temporary_file():
    # A function of `__main__` (a notebook's) travels as a written module;
    # when it returns no model, the error names it, not that module's path.
    function = types.FunctionType(_returns_none.__code__, {})
    function.__module__ = "__main__"
    with pytest.raises(TargetError) as raised:
        tfdet.check(function, steps=1, perturb="none")
    assert "__main__:_returns_none" in str(raised.value)
    assert "tfdet-target-" not in str(raised.value)
