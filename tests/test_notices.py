"""TensorFlow's C++ start-up notices are hidden by tfdet's commands."""

from __future__ import annotations

from tests.conftest import clean_env, run_python, run_tfdet
from tfdet import _notices

_SAMPLE = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795430340.530194    4276 port.cc:153] oneDNN custom operations are on.
I0000 00:00:1795430340.752710    4276 cpu_feature_guard.cc:227] This TensorFlow binary is optimized
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1732000000.1 12 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
W0000 00:00:1732000000.2 12 cuda_blas.cc:1418] computation placer already registered.
E0000 00:00:1732000000.3 12 op_kernel.cc:1]  OP_REQUIRES failed: a real error
Traceback (most recent call last):
"""


def test_without_notices_keeps_real_errors():
    assert _notices.without_notices(_SAMPLE) == (
        "E0000 00:00:1732000000.3 12 op_kernel.cc:1]  OP_REQUIRES failed: a real error\n"
        "Traceback (most recent call last):\n"
    )


def test_env_hides_notices_unless_verbose():
    quiet = run_tfdet("env")
    assert quiet.returncode == 0, quiet.stderr
    assert "tensorflow:" in quiet.stdout
    output = quiet.stdout + quiet.stderr
    assert "absl::InitializeLog" not in output
    assert "port.cc" not in output
    # The notices exist: --verbose (before or after the subcommand) shows them.
    # oneDNN forced on makes TensorFlow print one on every CPU (left to itself,
    # it prints none where it picks oneDNN off, as on an AVX2-only EPYC).
    noisy = clean_env(TF_ENABLE_ONEDNN_OPTS="1")
    for args in (("env", "--verbose"), ("--verbose", "env")):
        verbose = run_tfdet(*args, env=noisy)
        assert verbose.returncode == 0, verbose.stderr
        assert "absl::InitializeLog" in verbose.stderr


def test_run_hides_notices_in_the_script_unless_verbose(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\nimport tensorflow as tf\n"
        "print('sum', int(tf.reduce_sum(tf.ones(3))))\n"
        "print('stderr still works', file=sys.stderr)\n"
    )
    quiet = run_tfdet("run", str(script))
    assert quiet.returncode == 0, quiet.stderr
    assert "sum 3" in quiet.stdout
    assert "stderr still works" in quiet.stderr
    assert "absl::InitializeLog" not in quiet.stderr
    verbose = run_tfdet("--verbose", "run", str(script))
    assert verbose.returncode == 0, verbose.stderr
    assert "absl::InitializeLog" in verbose.stderr


def test_what_a_crash_says_while_hidden_still_gets_out():
    # TensorFlow's import can die in C++ (an illegal instruction, a failed
    # check): the reason must not be swallowed with the notices.
    result = run_python(
        """
        import os
        from tfdet import _notices
        with _notices.hidden():
            os.write(2, b"I0000 00:00:17.5 42 port.cc:153] oneDNN notice\\n")
            os.write(2, b"F0000 fatal: the reason\\n")
            os.abort()
        """
    )
    assert result.returncode < 0
    assert "the reason" in result.stderr
    assert "oneDNN notice" not in result.stderr


_PROBED_IMPORT = """
import importlib.util, sys
from tfdet import _notices
if sys.argv[1] == "hidden":
    _notices.hide_at_import()
# A probe that asks for TensorFlow without importing it (tfdet's cache-size
# pin locates the library so), then the import.
assert importlib.util.find_spec("tensorflow") is not None
import tensorflow as tf
print("sum", int(tf.reduce_sum(tf.ones(3))))
"""


def test_a_probe_before_the_import_leaves_the_import_hidden():
    stderr = {}
    for mode in ("hidden", "shown"):
        result = run_python(
            f"import sys; sys.argv[1:] = [{mode!r}]\n" + _PROBED_IMPORT,
            env=clean_env(TF_ENABLE_ONEDNN_OPTS="1"),  # a notice on every CPU
        )
        assert result.returncode == 0 and "sum 3" in result.stdout, result.stderr
        stderr[mode] = result.stderr
    assert "absl::InitializeLog" in stderr["shown"]
    assert "absl::InitializeLog" not in stderr["hidden"]
