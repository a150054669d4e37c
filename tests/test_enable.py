"""`tfdet.enable()`: what it pins, what it refuses, and what it warns about.

Argument errors are raised before `enable()` touches anything, so they are
checked in this process. Everything that gets past validation changes global
TensorFlow state that cannot be undone, so it runs in a fresh interpreter;
several assertions share one interpreter where that saves a TensorFlow start.
"""

from __future__ import annotations

import os

import pytest

import tfdet
from tests.conftest import clean_env, last_json_line, run_python
from tfdet._pin import _cpus, _isa, _versions

# line. Prepended to each child script.
_PRELUDE = """
import json, os, sys, warnings
warnings.simplefilter("always")
_caught = []
# Each message with where it points: the caller of enable(), not tfdet.
warnings.showwarning = lambda message, category, filename, *args, **kwargs: (
    _caught.append(f"{message} [at {filename}]")
)
import tfdet
out = {}

def attempt(name, **kwargs):
    try:
        tfdet.enable(**kwargs)
    except Exception as error:
        out[name] = {
            "type": type(error).__name__,
            "message": str(error),
            "setting": getattr(error, "setting", None),
            "differences": {k: list(v) for k, v in getattr(error, "differences", {}).items()},
        }
    else:
        out[name] = None

def finish():
    out["warnings"] = _caught
    out["enabled"] = tfdet.is_enabled()
    print(json.dumps(out, default=str))
"""


def _child(code: str, **env: str | None) -> dict:
    result = run_python(
        _PRELUDE + code + "\nfinish()\n", env=clean_env(**env), timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)


def _matching(warnings: list[str], text: str) -> list[str]:
    return [message for message in warnings if text in message]


# --- Bad arguments: ValueError before anything changes (in this process). ---


@pytest.fixture
def untouched_environment():
    """Fails the test if `enable()` changed the environment or activated."""

    def snapshot() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    before, was_enabled = snapshot(), tfdet.is_enabled()
    yield
    assert snapshot() == before
    assert tfdet.is_enabled() == was_enabled


@pytest.mark.parametrize(
    "seed",
    [-1, 2**32, 1.0, "3", True, None],
    ids=["negative", "2**32", "float", "str", "bool", "None"],
)
def test_bad_seed_is_a_value_error_naming_the_argument(
    seed, untouched_environment
) -> None:
    with pytest.raises(ValueError, match=r"Expected `seed`.*Received: seed="):
        tfdet.enable(seed=seed)


def test_seed_range_error_says_the_accepted_range(untouched_environment) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 4294967295\]"):
        tfdet.enable(seed=2**32)


@pytest.mark.parametrize("threads", [0, -2, 1025, 10000, 2.0, "1", False], ids=str)
def test_bad_threads_is_a_value_error_naming_the_argument(
    threads, untouched_environment
) -> None:
    with pytest.raises(ValueError, match=r"Expected `threads`.*Received: threads="):
        tfdet.enable(threads=threads)


@pytest.mark.parametrize("cpu_isa", ["AVX3", "", 2])
def test_unknown_isa_is_a_value_error_listing_accepted_names(
    cpu_isa, untouched_environment
) -> None:
    with pytest.raises(ValueError) as info:
        tfdet.enable(cpu_isa=cpu_isa)
    message = str(info.value)
    assert "cpu_isa" in message
    assert f"Received: cpu_isa={cpu_isa!r}" in message
    for accepted in ("SSE41", "AVX2", "AVX512_CORE"):
        assert accepted in message


def test_isa_the_cpu_lacks_is_a_value_error_naming_the_best_level(
    monkeypatch, untouched_environment
) -> None:
    monkeypatch.setattr(_isa, "applies", lambda: True)
    monkeypatch.setattr(_isa, "cpu_flags", lambda: frozenset({"sse4_1", "avx", "avx2"}))
    with pytest.raises(ValueError, match=r"up to AVX2.*cpu_isa='AVX512_CORE'"):
        tfdet.enable(cpu_isa="AVX512_CORE")


@pytest.mark.parametrize(
    "patches", [["no_such_patch"], "bincount"], ids=["unknown", "str"]
)
def test_bad_patches_is_a_value_error_listing_known_ones(
    patches, untouched_environment
) -> None:
    with pytest.raises(ValueError, match=r"Expected `patches`.*bincount"):
        tfdet.enable(patches=patches)


def test_threads_range_error_says_the_accepted_range(untouched_environment) -> None:
    # 10000 threads made TensorFlow abort in pthread_create after minutes.
    with pytest.raises(ValueError, match=r"in \[1, 1024\]"):
        tfdet.enable(threads=10000)


@pytest.mark.parametrize("patches", [42, [1], 2.5], ids=str)
def test_patches_of_the_wrong_type_is_a_value_error_naming_it(
    patches, untouched_environment
) -> None:
    with pytest.raises(ValueError, match=r"Expected `patches`.*Received: patches="):
        tfdet.enable(patches=patches)


@pytest.mark.parametrize("strict", ["no", 0, None], ids=str)
def test_strict_must_be_a_bool(strict, untouched_environment) -> None:
    with pytest.raises(ValueError, match=r"Expected `strict`.*Received: strict="):
        tfdet.enable(strict=strict)


def test_bad_onednn_is_a_value_error(untouched_environment) -> None:
    with pytest.raises(ValueError, match=r"Expected `onednn`"):
        tfdet.enable(onednn="yes")


# --- A normal enable(), then repeated calls. ---


def test_enable_pins_everything_and_repeat_calls_are_no_ops() -> None:
    out = _child(
        """
import gc
import random
import numpy as np
from tfdet._pin import _cpus
profile = tfdet.enable()
out["collector"] = [gc.isenabled(), gc.get_freeze_count()]
out["profile"] = profile.to_dict()
out["same_profile"] = tfdet.profile() is profile
out["env"] = {name: os.environ.get(name) for name in (
    "PYTHONHASHSEED", "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC",
    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "ONEDNN_MAX_CPU_ISA",
    "XLA_FLAGS")}
out["python_random"] = random.random() == random.Random(0).random()
out["numpy_random"] = np.random.rand() == np.random.RandomState(0).rand()
import tensorflow as tf
from tensorflow.python.framework import config
out["op_determinism"] = config.is_op_determinism_enabled()
out["tf_threads"] = [tf.config.threading.get_intra_op_parallelism_threads(),
                     tf.config.threading.get_inter_op_parallelism_threads()]
# Same settings spelled differently, and strict=False: the same profile.
from tfdet._patching import _registry
out["repeat_is_same"] = all(
    tfdet.enable(**kwargs) is profile
    for kwargs in (
        {}, {"seed": 0, "threads": _cpus.usable_cpus(), "cpu_isa": "avx2"},
        {"strict": False},
        # The same patch selection written three ways (check --script pins
        # ("auto",); a script may write "auto" or the names it selects).
        {"patches": ("auto",)}, {"patches": _registry.resolve("auto")},
    )
)
attempt("other_threads", threads=_cpus.usable_cpus() + 1)
attempt("other_seed_and_isa", seed=1, cpu_isa="SSE41")
try:  # The inter-op pool is pinned too.
    tf.config.threading.set_inter_op_parallelism_threads(_cpus.usable_cpus() + 1)
    out["inter_op_2"] = None
except tfdet.ProfileMismatchError as error:
    out["inter_op_2"] = str(error)
out["still_same"] = tfdet.profile() is profile
# XLA_FLAGS was set before start: kept, and XLA still accepts every flag (an
# unknown flag would abort the process here).
jitted = tf.function(lambda x: tf.reduce_sum(x * 2.0), jit_compile=True)
out["jit_result"] = float(jitted(tf.ones([4])))
""",
        XLA_FLAGS="--xla_cpu_enable_fast_math=false",
    )
    profile = out["profile"]
    assert out["enabled"] and out["same_profile"]
    # TensorFlow's import (over 100,000 objects) frozen, the collector on.
    collecting, frozen = out["collector"]
    assert collecting and frozen > 100_000
    assert profile["seed"] == 0
    # Every CPU this process may use, in both pools (AddN sums in a fixed
    # order, so the inter-op pool may run ops side by side).
    cpus = _cpus.usable_cpus()
    assert profile["intra_op_threads"] == profile["inter_op_threads"] == cpus
    assert out["tf_threads"] == [cpus, cpus]
    assert {"fixed_order_add_n", "pool_size_free_products"} <= set(profile["patches"])
    assert profile["op_determinism"] is True and out["op_determinism"]
    assert profile["xla_determinism"] is True
    assert profile["python_hash_seed"] is None  # Started without one.
    # What decides the bits under tf.distribute, as the default patches pin it.
    assert profile["distribution"] == {
        "auto_shard_policy": "DATA",
        "collective": "RING",
        "refused": "ParameterServerStrategy, tf.data service DYNAMIC sharding",
        "replica_seeds": "per replica",
    }
    if _isa.applies():
        assert profile["cpu_isa"] == "AVX2"
        assert out["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    else:
        assert profile["cpu_isa"] == _isa.NOT_APPLICABLE
    assert out["env"]["PYTHONHASHSEED"] == "0"  # For child processes.
    assert (
        out["env"]["TF_DETERMINISTIC_OPS"]
        == out["env"]["TF_CUDNN_DETERMINISTIC"]
        == "1"
    )
    assert (
        out["env"]["TF_NUM_INTRAOP_THREADS"]
        == out["env"]["TF_NUM_INTEROP_THREADS"]
        == str(cpus)
    )
    # XLA:CPU's ISA cap exists from TensorFlow 2.19 (earlier XLA aborts on it).
    capped = _isa.applies() and _versions.xla_cpu_isa_cap_known()
    assert out["env"]["XLA_FLAGS"] == (
        "--xla_cpu_enable_fast_math=false --xla_gpu_deterministic_ops=true"
        + (" --xla_cpu_max_isa=AVX2" if capped else "")
    )
    assert out["jit_result"] == 8.0
    assert out["python_random"] and out["numpy_random"]
    assert out["repeat_is_same"] and out["still_same"]
    assert out["other_threads"]["type"] == "ProfileMismatchError"
    assert out["other_threads"]["differences"] == {"threads": [cpus, cpus + 1]}
    assert "Call enable() once" in out["other_threads"]["message"]
    assert f"sizes the inter-op pool at {cpus}" in out["inter_op_2"]
    assert out["other_seed_and_isa"]["differences"] == {
        "seed": [0, 1],
        "cpu_isa": ["AVX2", "SSE41"],
    }


def test_unset_pythonhashseed_is_a_warning_naming_tfdet_run() -> None:
    out = _child("tfdet.enable()")
    (warning,) = _matching(out["warnings"], "PYTHONHASHSEED")
    assert "None" in warning and "'0'" in warning
    assert "tfdet run" in warning
    assert warning.endswith("[at <string>]")


@pytest.mark.parametrize("machine", ["riscv64", "aarch64"])
def test_an_untested_platform_is_said_once_and_x86_pins_skip_off_x86(machine) -> None:
    # Here as Linux riscv64, which tfdet never ran on, and as Linux aarch64,
    # which its CI runs emulated: neither has the x86 pins.
    out = _child(
        f"""
import platform
platform.machine = lambda: "{machine}"
profile = tfdet.enable(seed=0)
tfdet.enable(seed=0)
out["profile"] = profile.to_dict()
""",
        PYTHONHASHSEED="0",
    )
    said = _matching(out["warnings"], "not been tested")
    if machine == "aarch64":
        assert not said
    else:
        (warning,) = said
        assert f"Linux {machine}" in warning and "tfdet check" in warning
    assert (
        out["profile"]["cpu_isa"]
        == out["profile"]["xla_cpu_isa"]
        == (_isa.NOT_APPLICABLE)
    )
    # On this platform itself, nothing is said.
    assert not _matching(_child("tfdet.enable(seed=0)")["warnings"], "not been tested")


def test_matching_pythonhashseed_numpy_seed_and_onednn_off() -> None:
    # The largest seed, as a NumPy integer; the interpreter started with the
    # matching hash seed; oneDNN custom ops requested off before TF import.
    out = _child(
        """
import gc
import numpy as np
gc.disable()
profile = tfdet.enable(seed=np.uint32(2**32 - 1), onednn=False)
out["collector"] = [gc.isenabled(), gc.get_freeze_count()]
out["profile"] = profile.to_dict()
out["seed_type"] = type(profile.seed).__name__
out["onednn_env"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
""",
        PYTHONHASHSEED=str(2**32 - 1),
    )
    assert out["profile"]["seed"] == 2**32 - 1 and out["seed_type"] == "int"
    assert out["profile"]["python_hash_seed"] == str(2**32 - 1)
    assert not _matching(out["warnings"], "PYTHONHASHSEED")
    assert out["profile"]["onednn_opts"] is False and out["onednn_env"] == "0"
    # A collector the script turned off stays off.
    collecting, frozen = out["collector"]
    assert not collecting and frozen > 100_000


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA caps are x86-64 only")
def test_lower_preset_isa_cap_is_kept_with_a_warning() -> None:
    out = _child(
        """
profile = tfdet.enable()
out["cpu_isa"] = profile.cpu_isa
out["env"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
""",
        ONEDNN_MAX_CPU_ISA="SSE41",
    )
    assert out["cpu_isa"] == out["env"] == "SSE41"
    (warning,) = _matching(out["warnings"], "ONEDNN_MAX_CPU_ISA=SSE41")
    assert "keeping SSE41" in warning and "differ" in warning


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA caps are x86-64 only")
def test_higher_preset_isa_cap_is_lowered_to_the_requested_one() -> None:
    out = _child(
        """
out["cpu_isa"] = tfdet.enable().cpu_isa
out["env"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
""",
        ONEDNN_MAX_CPU_ISA="ALL",
    )
    assert out["cpu_isa"] == out["env"] == "AVX2"
    assert not _matching(out["warnings"], "ONEDNN_MAX_CPU_ISA")


# --- Too late: after TensorFlow started. ---


def test_onednn_is_pinned_on_before_import_whatever_the_cpu_would_choose() -> None:
    # TensorFlow's own choice follows the CPU (off on CPUs without AVX-512
    # VNNI/BF16 or AMX); enable() before the import pins it on. The second
    # child imitates such a CPU's choice (TF_ENABLE_ONEDNN_OPTS=0 at import):
    # the default profile is refused, naming the ways out, and onednn=None
    # records the CPU's choice instead.
    pinned = _child(
        """
out["profile"] = tfdet.enable().to_dict()
from tensorflow.python.util import _pywrap_util_port
out["tensorflow_says"] = bool(_pywrap_util_port.IsMklEnabled())
"""
    )
    assert pinned["profile"]["onednn_opts"] is True
    assert pinned["tensorflow_says"] is True
    chosen_off = _child(
        """
import tensorflow as tf
attempt("default")
out["profile"] = tfdet.enable(onednn=None).to_dict()
""",
        TF_ENABLE_ONEDNN_OPTS="0",
    )
    error = chosen_off["default"]
    assert error["type"] == "TooLateError" and error["setting"] == "onednn", error
    assert "oneDNN custom ops off" in error["message"]
    assert "onednn=None" in error["message"]
    assert chosen_off["profile"]["onednn_opts"] is False


def test_too_late_threads_and_onednn_are_refused_even_with_strict_false() -> None:
    # Both always change the bits: strict=False does not soften them.
    out = _child(
        """
import tensorflow as tf
attempt("onednn_after_import", onednn=False)
attempt("onednn_after_import_lenient", onednn=False, strict=False)
from tfdet._target import _load
_load.build("builtin:cnn")  # Creates weights: TF's runtime has started.
attempt("threads_default")
attempt("threads_only", cpu_isa=None)
attempt("threads_lenient", strict=False)
attempt("threads_lenient_no_isa", cpu_isa=None, strict=False)
out["isa_env_after_refusals"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
out["threads_env_after_refusals"] = os.environ.get("TF_NUM_INTRAOP_THREADS")
""",
        PYTHONHASHSEED="7",
        # oneDNN on at import, whatever this CPU's default: the default
        # profile's state, so only `onednn=False` and the threads are late.
        TF_ENABLE_ONEDNN_OPTS="1",
    )
    for name in ("onednn_after_import", "onednn_after_import_lenient"):
        error = out[name]
        assert error["type"] == "TooLateError" and error["setting"] == "onednn", error
        assert "TF_ENABLE_ONEDNN_OPTS" in error["message"]
    for name in (
        "threads_default",
        "threads_only",
        "threads_lenient",
        "threads_lenient_no_isa",
    ):
        error = out[name]
        assert error["type"] == "TooLateError", error
        assert error["setting"] == "threads"
        assert "tfdet run" in error["message"]
        assert "tfdet.enable()" in error["message"]
    assert out["enabled"] is False
    # A refused call leaves no trace.
    assert out["isa_env_after_refusals"] is None
    assert out["threads_env_after_refusals"] is None
    assert not _matching(out["warnings"], "Too late")


@pytest.mark.skipif(not _isa.applies(), reason="oneDNN ISA caps are x86-64 only")
def test_late_isa_cap_is_refused_when_strict_and_written_with_a_warning_when_not() -> (
    None
):
    # The runtime has started (a variable exists, threads were pinned by the
    # script itself) but no oneDNN primitive ran: with strict=False the cap
    # is still written, and oneDNN's own report shows it took effect.
    code = (
        _PRELUDE
        + """
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
weights = tf.Variable(tf.ones([64, 64]))
from tfdet._setup import _enable
out["started"] = _enable._runtime_started()
attempt("strict", threads=1, cpu_isa="AVX2")
out["env_after_refusal"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
profile = tfdet.enable(threads=1, cpu_isa="AVX2", strict=False)
out["profile"] = profile.to_dict()
out["env"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
tf.matmul(weights, weights)  # The first oneDNN primitive.
finish()
"""
    )
    result = run_python(
        code,
        # TensorFlow is imported first: oneDNN in the default profile's state.
        env=clean_env(
            ONEDNN_VERBOSE="1", PYTHONHASHSEED="0", TF_ENABLE_ONEDNN_OPTS="1"
        ),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = last_json_line(result.stdout)
    assert out["started"] is True
    assert out["strict"]["type"] == "TooLateError"
    assert out["strict"]["setting"] == "cpu_isa"
    assert out["env_after_refusal"] is None
    assert out["enabled"] and out["profile"]["cpu_isa"] == out["env"] == "AVX2"
    assert out["profile"]["intra_op_threads"] == 1
    (warning,) = _matching(out["warnings"], "Too late to pin `cpu_isa`")
    assert "strict=False" in warning
    assert "only if no oneDNN primitive" in warning
    isa_lines = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.startswith("onednn_verbose") and ",isa:" in line
    ]
    if not isa_lines:
        pytest.skip("this oneDNN build does not report its ISA (ONEDNN_VERBOSE)")
    assert "AVX2" in isa_lines[0] and "512" not in isa_lines[0], isa_lines


def test_repeat_call_with_other_arguments_warns_with_strict_false() -> None:
    out = _child(
        """
profile = tfdet.enable(threads=1)
attempt("strict", threads=2)
out["lenient_is_active"] = tfdet.enable(threads=2, seed=5, strict=False) is profile
out["still_active"] = tfdet.profile() is profile
import tensorflow as tf
out["tf_threads"] = tf.config.threading.get_intra_op_parallelism_threads()
""",
        PYTHONHASHSEED="0",
    )
    assert out["strict"]["type"] == "ProfileMismatchError"
    assert out["strict"]["differences"] == {"threads": [1, 2]}
    assert out["lenient_is_active"] and out["still_active"]
    assert out["tf_threads"] == 1  # The first profile stays in force.
    (warning,) = _matching(out["warnings"], "already called with other arguments")
    assert "strict=False" in warning and "stays in force" in warning
    assert "threads=1 vs 2" in warning and "seed=0 vs 5" in warning
    assert warning.endswith("[at <string>]")


@pytest.mark.tf_keras
def test_patches_do_not_depend_on_whether_tf_keras_is_imported_first() -> None:
    # README: call enable() first. A script that imports tf_keras after it
    # must get the same profile, and the same patched optimizers, as one that
    # imports it before.
    script = """
import json, sys
import tfdet
if {before}:
    import tf_keras
profile = tfdet.enable()
imported_by_enable = "tf_keras" in sys.modules
import tf_keras
from tf_keras.src.optimizers import optimizer
from tf_keras.src.optimizers.legacy import optimizer_v2
print(json.dumps({{
    "patches": list(profile.patches),
    "imported_by_enable": imported_by_enable,
    "wrapped": [
        getattr(vars(cls).get("apply_gradients"), "__tfdet_patch__", None)
        for cls in (optimizer.Optimizer, optimizer_v2.OptimizerV2)
    ],
}}))
"""
    results = {}
    for before in (True, False):
        result = run_python(
            script.format(before=before),
            # `import tf_keras` imports TensorFlow: oneDNN must already be in
            # the default profile's state for enable() to accept it.
            env=clean_env(PYTHONHASHSEED="0", TF_ENABLE_ONEDNN_OPTS="1"),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results[before] = last_json_line(result.stdout)
    assert results[True]["patches"] == results[False]["patches"]
    assert "sparse_optimizer_update" in results[False]["patches"]
    for out in results.values():
        assert out["wrapped"] == ["sparse_optimizer_update"] * 2
    # enable() does not import tf_keras to patch it: the install waits for it.
    assert results[False]["imported_by_enable"] is False


@pytest.mark.parametrize(
    ("value", "flavor"),
    [
        ("1", "tf_keras"),
        ("true", "tf_keras"),
        ("True", "tf_keras"),
        ("TRUE", "keras3"),
        ("yes", "keras3"),
        ("0", "keras3"),
        (None, "keras3"),
    ],
)
def test_keras_flavor_follows_tensorflows_reading_of_tf_use_legacy_keras(
    value: str | None, flavor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The profile must name the Keras that TensorFlow will actually use.
    if value is None:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    else:
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
    assert _versions.keras_flavor() == flavor


# --- XLA:CPU follows the profile's ISA cap. ---

# One jit-compiled multiply-add: XLA:CPU fuses it into an FMA where the ISA
# allows one (AVX2) and cannot at AVX, so its bits show the cap XLA used.
_XLA_MULTIPLY_ADD = """
import hashlib
import numpy as np
import tensorflow as tf
x = tf.constant(np.random.default_rng(0).standard_normal(4096).astype(np.float32))
value = tf.function(lambda: x * 1.7 + 0.3, jit_compile=True)().numpy()
out["digest"] = hashlib.sha256(value.tobytes()).hexdigest()
"""


@pytest.mark.skipif(
    not _isa.applies() or not _isa.supports("AVX2"),
    reason="needs an x86-64 CPU with AVX2",
)
def test_xla_cpu_code_follows_the_cpu_isa_cap_enable_pins() -> None:
    under_avx = _child('tfdet.enable(cpu_isa="AVX")' + _XLA_MULTIPLY_ADD)
    under_avx2 = _child('tfdet.enable(cpu_isa="AVX2")' + _XLA_MULTIPLY_ADD)
    # Without tfdet, XLA's own flag gives the same bits as enable()'s cap...
    xla_flag_only = _child(_XLA_MULTIPLY_ADD, XLA_FLAGS="--xla_cpu_max_isa=AVX")
    assert under_avx["digest"] == xla_flag_only["digest"]
    # ...and the cap decides them: without it XLA would use this CPU's AVX2
    # for both profiles, and a machine with another ISA would differ.
    assert under_avx["digest"] != under_avx2["digest"]
