"""tfdet on aarch64: the same bits in fresh processes on one or two cores,
and on another ARM core's vector unit.

Runs only in an aarch64 process: on ARM hardware, or in CI's emulated one
(`ci/matrix.py --aarch64`: TensorFlow's aarch64 wheel under QEMU's user-mode
emulator, an emulation of an ARM CPU, not one). Each check carries its
control: the same perturbations without tfdet, which must separate the runs,
or the identical verdict would prove nothing there.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_tfdet
from tfdet._pin import _arm, _environment, _settings

pytestmark = pytest.mark.skipif(
    not _arm.applies(),
    reason="needs an aarch64 process (ci/matrix.py --aarch64 runs one under QEMU)",
)
# Seconds a run may take: an emulated process starts TensorFlow in about a
# minute on a 2-core EPYC Zen 3, and trains 20-50 times slower than native.
RUN_TIMEOUT = 1800
TARGETS = REPO / "tests" / "targets"


def test_enable_keeps_the_bits_on_one_or_two_cores_and_plain_tensorflow_does_not(
    tmp_path, two_cpus
):
    # The second run also runs on another emulated core (QEMU's default one
    # with another vector unit: NEON under CI's SVE `max`), in the same two
    # runs: no process more.
    # A Dense model, not the built-in CNN: the same claim at half the CPU
    # (CI runs this test under QEMU, 20-50 times slower than natively).
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check", f"{TARGETS}/check_models.py:wide_mlp",
        "--device", "cpu", "--steps", "2", "--no-attribute", "--control",
        "--perturb", "affinity,hashseed,emulated_cpu", "--timeout", str(RUN_TIMEOUT),
        "--json", str(report_path),
        timeout=4 * RUN_TIMEOUT,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    report = json.loads(report_path.read_text())
    cpu = report["devices"]["cpu"]
    assert cpu["verdict"] == "identical"
    assert all(run["ok"] and run["steps_recorded"] == 2 for run in cpu["runs"])
    assert "affinity" not in cpu["perturbations_skipped"]
    assert "emulated_cpu" not in cpu["perturbations_skipped"]
    assert "neoverse-n1" in cpu["runs"][1]["perturbations"]["emulated_cpu"]
    # Without tfdet, TensorFlow sizes its pools from the CPUs a run may use,
    # and Eigen's products on aarch64 (NEON) add in another order with them.
    assert report["control"]["verdict"] == "diverged", output


def test_env_names_the_vector_unit_and_an_emulator(tmp_path):
    report_path = tmp_path / "env.json"
    proc = run_tfdet("env", "--json", str(report_path), timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads(report_path.read_text())
    assert facts["machine"] == "aarch64"
    assert "asimd" in facts["cpu_isa_flags"]
    assert facts["cpu_isa_in_force"] == _arm.environment_isa()
    # The profile pins oneDNN off here: its kernels follow the SVE length.
    assert _settings.DEFAULT_ONEDNN is False
    if _arm.emulated_on(_environment._cpuinfo_fields(("vendor_id",))):
        assert facts["cpu_emulated"].startswith("aarch64 ")
        assert facts["cpu_vendor"] == "QEMU (emulated)"
    else:
        assert facts["cpu_emulated"] is None


# The kernel digests of the installed tfdet (not the checkout's: `-I` keeps
# the checkout off sys.path, and tfdet is imported before the benchmark
# puts it there), and where the library came from.
INSTALLED_DIGESTS = """
import importlib.util, json, os, sys
from tfdet._kernels import fixed_order
spec = importlib.util.spec_from_file_location("digests", sys.argv[1])
digests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digests)
try:
    found = digests.digests()
except RuntimeError as error:  # No kernel: none shipped, no compiler.
    print(json.dumps({"unavailable": str(error)}))
    sys.exit(0)
path = fixed_order.vector_path()
os.environ[fixed_order.ISA_VARIABLE] = "scalar"  # Read at each call.
scalar = digests.digests()["kernel"]
print(json.dumps({"found": found, "path": path, "scalar": scalar,
                  "origin": fixed_order.LIBRARY.origin(),
                  "recorded": digests.recorded()["x86_64"]["digests"]}))
"""


def test_the_fixed_order_kernel_gives_the_bits_recorded_on_x86_64(tmp_path):
    """tfdet's kernel computes here the products and convolution x86-64 did.

    Its chains are fixed by the shapes alone, so its NEON and scalar paths
    on this ARM core give the digests recorded with the AVX2 path on an
    x86-64 CPU
    (`benchmarks/fixed_order_digests.json`); TensorFlow's own ops, the
    control, give others here. Run by the tfdet installed here, with the
    kernels its wheel holds: in CI's emulated environment, the ones the
    cross compiler built (ci/aarch64.py), with no compiler of its own.
    """
    import shutil
    import subprocess
    import sys

    from tests.conftest import clean_env, last_json_line

    env = clean_env(PYTHONPATH=None)
    done = subprocess.run(
        [sys.executable, "-I", "-c", INSTALLED_DIGESTS,
         str(REPO / "benchmarks" / "fixed_order_digests.py")],
        env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = last_json_line(done.stdout)
    if "unavailable" in result and shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip(
            "no kernels in the installed wheel: ci/aarch64.py builds them "
            "with aarch64-linux-gnu-g++, which is not installed"
        )
    found, x86 = result["found"], result["recorded"]
    assert result["origin"] in ("wheel", "install"), result
    # Its NEON path, and its scalar path, give x86-64's AVX bits.
    assert result["path"] == "neon", result
    assert found["kernel"] == x86["kernel"], (found, x86)
    assert result["scalar"] == x86["kernel"], result
    for op in ("matmul", "conv2d"):
        assert found["tensorflow"][op] != x86["tensorflow"][op], (found, x86)


# The portable math library's digests, by the installed tfdet (as above).
INSTALLED_MATH_DIGESTS = """
import importlib.util, json, sys
from tfdet._kernels import portable_math
spec = importlib.util.spec_from_file_location("digests", sys.argv[1])
digests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digests)
try:
    found = digests.digests()
except RuntimeError as error:  # No library: none shipped, no compiler.
    print(json.dumps({"unavailable": str(error)}))
    sys.exit(0)
print(json.dumps({"found": found, "origin": portable_math.LIBRARY.origin(),
                  "recorded": digests.recorded()["x86_64"]["digests"]}))
"""


def test_the_portable_functions_and_sums_give_the_bits_recorded_on_x86_64(tmp_path):
    """exp, log, tanh, sigmoid, sin, cos, pow and the fixed-order sums, with
    their gradients, computed here by tfdet's library give the digests
    recorded on x86-64 (`benchmarks/portable_math_digests.json`); TensorFlow's
    own ops, the control, give others here than there. So does a model (a
    Dense softmax trained with the categorical cross-entropy) under
    `enable()`, and, its control, without the patches that call the library."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import clean_env, last_json_line

    done = subprocess.run(
        [sys.executable, "-I", "-c", INSTALLED_MATH_DIGESTS,
         str(REPO / "benchmarks" / "portable_math_digests.py")],
        env=clean_env(PYTHONPATH=None), cwd=tmp_path, capture_output=True,
        text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = last_json_line(done.stdout)
    if "unavailable" in result and shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip(
            "no library in the installed wheel: ci/aarch64.py builds it "
            "with aarch64-linux-gnu-g++, which is not installed"
        )
    found, x86 = result["found"], result["recorded"]
    assert result["origin"] in ("wheel", "install"), result
    assert found["kernel"] == x86["kernel"], (found, x86)
    differ = [
        n for n in x86["tensorflow"] if found["tensorflow"][n] != x86["tensorflow"][n]
    ]
    assert {"exp", "tanh", "sigmoid", "rows", "model"} <= set(differ), differ
