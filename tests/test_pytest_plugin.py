"""The pytest plugin: `pytest --tfdet` and the `tfdet_reproducible` fixture.

Each scenario runs pytest in a fresh process (`runpytest_subprocess`):
`--tfdet` changes TensorFlow's global state, which no test process may keep.
The plugin is found through its `pytest11` entry point, as for a user.
"""

from __future__ import annotations

import importlib.metadata
import shutil

import pytest

from tfdet import _pytest_plugin
from tfdet._pin._environment import DETERMINISM_VARIABLES

pytest_plugins = ["pytester"]


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    # No determinism variables from the outer environment: the generated
    # sessions must show what the plugin does by itself.
    for key in DETERMINISM_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    return pytester


def test_entry_point_registered():
    # Without it no user session loads the plugin; a stale editable install
    # lacks it: `pip install -e .` again.
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.name == "tfdet"] == ["tfdet._pytest_plugin"]


def test_without_flag_plugin_does_nothing(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import sys

        def test_no_tensorflow(request):
            assert request.config.pluginmanager.has_plugin("tfdet")
            assert "tensorflow" not in sys.modules
            assert "keras" not in sys.modules
            assert not request.config.pluginmanager.has_plugin("tfdet-reseed")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "tfdet:" not in result.stdout.str()


@pytest.mark.slow
def test_flag_enables_before_conftest_and_reseeds_each_test(pytester: pytest.Pytester):
    # A conftest that runs a TensorFlow op at import: covered, because the
    # plugin enables before the first conftest is imported.
    pytester.makeconftest(
        """
        import tensorflow as tf

        STARTED = tf.constant(1.0) + 1.0
        """
    )
    pytester.makeini("[pytest]\ntfdet_seed = 7\n")
    pytester.makepyfile(
        test_suite="""
        import os

        import keras
        import numpy as np
        import tensorflow as tf
        import tfdet

        DRAWS = []


        def build():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model

        def test_enabled():
            assert tfdet.profile().seed == 7
            assert tf.config.threading.get_intra_op_parallelism_threads() == 2

        def test_first():
            DRAWS.append((np.random.random(), float(tf.random.uniform([]))))

        def test_second():
            DRAWS.append((np.random.random(), float(tf.random.uniform([]))))
            # Reseeded before each test: the same draws, whatever ran before.
            assert DRAWS[0] == DRAWS[1]

        def test_fixture_takes_session_settings(tfdet_reproducible):
            assert os.environ["PYTHONHASHSEED"] == "7"  # Written by enable().
            # A TARGET string resolves from the current directory, as in a shell.
            report = tfdet_reproducible("test_suite:build", steps=1, perturb="none")
            assert (report.seed, report.threads) == (7, 2)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfdet", "--tfdet-threads", "2"
    )
    result.stdout.fnmatch_lines(["tfdet: enabled, seed=7 threads=2 cpu_isa=*"])
    result.assert_outcomes(passed=4)
    # The same draws in two tests are the plugin's doing: without it they differ.
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "not fixture")
    plain.assert_outcomes(passed=1, failed=2, deselected=1)


@pytest.mark.slow
def test_too_late_fails_session_with_message(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    # A plugin that runs a TensorFlow op when pytest imports it, before
    # conftests: enable() cannot pin the thread pools any more. (oneDNN is
    # set as the profile wants at import, so the threads are what is late.)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    pytester.makepyfile(
        early_tf="""
        import tensorflow as tf

        STARTED = tf.constant(1.0) + 1.0
        """,
        test_anything="def test_never_runs():\n    pass\n",
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "early_tf", "--tfdet"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest --tfdet: Too late to pin `threads`*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "test_never_runs" not in result.stdout.str()


def test_bad_option_is_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile("def test_never_runs():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfdet", "--tfdet-seed", "x"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: Expected an integer for --tfdet-seed*Received: 'x'"]
    )


# The fixture runs `tfdet check` on functions of the generated test file.
FIXTURE_SUITE = """
import os

import keras
import numpy as np


class UrandomNoise(keras.layers.Layer):
    def call(self, inputs):
        return inputs + np.frombuffer(os.urandom(4), dtype=np.uint32)[0] / 2**32


class CrashWhenTraining(keras.layers.Layer):
    def call(self, inputs, training=None):
        if training:
            raise RuntimeError("boom: this layer refuses to train")
        return inputs


def _model(*middle):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4), *middle, keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def build_plain():
    return _model()


def build_noisy():
    return _model(UrandomNoise())


def build_crashing():
    return _model(CrashWhenTraining())


def test_plain(tfdet_reproducible):
    report = tfdet_reproducible(build_plain, steps=2)
    assert report.verdict == "identical"


def test_noisy(tfdet_reproducible):
    tfdet_reproducible(build_noisy, steps=2)


def test_crashing(tfdet_reproducible):
    tfdet_reproducible(build_crashing, steps=2)
"""


@pytest.mark.slow
def test_reproducible_fixture(pytester: pytest.Pytester):
    pytester.makepyfile(test_models=FIXTURE_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    # The divergence: step 0, the loss, both values with their bits.
    result.stdout.fnmatch_lines(
        [
            "*test_noisy*",
            "*bits diverged.",
            "*first divergence (run 0 vs run 1): *step 0, loss: expected "
            "'* [[]float32 0x*[]]', received '* [[]float32 0x*[]]' (* ulps apart).",
        ]
    )
    # A failed run is a failure with its stderr, never a pass.
    result.stdout.fnmatch_lines(["*test_crashing*", "*verdict 'failed' (exit 3)*"])
    assert "boom: this layer refuses to train" in out
    # Failures are tfdet's messages, not tracebacks through the plugin.
    assert "_pytest_plugin.py" not in out


def test_target_must_be_module_level():
    def nested():
        return None

    with pytest.raises(TypeError, match="module level"):
        _pytest_plugin._target_of(nested)
    with pytest.raises(TypeError, match="module level"):
        _pytest_plugin._target_of(lambda: None)
    assert _pytest_plugin._target_of("builtin:cnn") == "builtin:cnn"
    assert _pytest_plugin._target_of(test_entry_point_registered).endswith(
        "test_pytest_plugin.py:test_entry_point_registered"
    )


def test_settings_from_options_and_ini(pytester: pytest.Pytester):
    # In-process and without --tfdet: only the parsing, nothing enabled.
    pytester.makeini("[pytest]\ntfdet_seed = 5\ntfdet_threads = 3\n")
    config = pytester.parseconfig("--tfdet-threads", "4", "--tfdet-cpu-isa", "none")
    assert _pytest_plugin._settings(config, config.option) == {
        "seed": 5,
        "threads": 4,  # The command line over the ini file.
        "cpu_isa": None,
    }
    # What is given nowhere is left to enable()'s own default.
    config = pytester.parseconfig()
    assert _pytest_plugin._settings(config, config.option) == {"seed": 5, "threads": 3}


@pytest.mark.slow
def test_check_without_verdict_fails_or_skips(tmp_path):
    # No such TARGET file (exit 2 from the CLI): a failure with tfdet's message.
    with pytest.raises(pytest.fail.Exception, match=r"(?s)could not run.*No such file"):
        _pytest_plugin.check_or_fail(f"{tmp_path}/missing.py:build")
    if shutil.which("nvidia-smi") is None:
        # No GPU for device="gpu" (exit 4 from the CLI): skipped, with the reason.
        with pytest.raises(pytest.skip.Exception, match="Expected a GPU"):
            _pytest_plugin.check_or_fail("builtin:cnn", device="gpu")
