"""An emulated CPU of another vendor in `tfdet check` (QEMU's user mode).

The emulated run executes the same TensorFlow binary on QEMU's x86 code
generator: another vendor's CPUID, and RSQRTPS/RCPPS computed exactly. The
control: without tfdet, a model that reaches Rsqrt, Erfc, Reciprocal and
Softmax gives other bits emulated than native; with tfdet's portable
patches, the same bits. Skipped where `qemu-x86_64` is missing (the reason
names the package); CI installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import (
    ERFC_FOLLOWS_THE_CPU,
    REPO,
    TENSORFLOW_RELEASE,
    clean_env,
    last_json_line,
    run_tfdet,
)
from tfdet._errors import EXIT_DIVERGED, EXIT_OK, EXIT_USAGE
from tfdet._patching import _hazards
from tfdet._pin import _cpuid
from tfdet._protocol import _emulation

pytestmark = pytest.mark.skipif(
    _emulation.why_unavailable("AVX2") is not None,
    reason=f"no emulated CPU here: {_emulation.why_unavailable('AVX2')}",
)

CPU_MODEL_TARGET = f"{REPO / 'tests' / 'targets' / 'cpu_model_models.py'}:keras3"


@pytest.mark.slow
def test_portable_patches_carry_the_bits_to_an_emulated_cpu_of_another_vendor(
    tmp_path,
):
    # Both checks at once: each waits minutes on its emulated run.
    common = [
        sys.executable, "-m", "tfdet", "check", CPU_MODEL_TARGET, "--steps", "1",
        "--device", "cpu", "--perturb", "emulated_cpu", "--no-attribute",
    ]  # fmt: skip
    reports = {name: tmp_path / f"{name}.json" for name in ("tfdet", "plain")}
    processes = {
        name: subprocess.Popen(
            [*common, "--json", str(path)]
            + (["--no-enable"] if name == "plain" else []),
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, path in reports.items()
    }
    outputs = {name: p.communicate(timeout=1800)[0] for name, p in processes.items()}
    codes = {name: p.returncode for name, p in processes.items()}
    assert codes == {"tfdet": EXIT_OK, "plain": EXIT_DIVERGED}, outputs
    for name, path in reports.items():
        report = json.loads(path.read_text())
        native, emulated = report["devices"]["cpu"]["runs"]
        assert native["perturbations"]["emulated_cpu"] == "native (this CPU)"
        assert "emulation of a" in emulated["perturbations"]["emulated_cpu"]
        assert "emulated_cpu" in report["emulated"]
        assert "cpu_vendor" not in report["not_imitated"], name
    # The control: the bits that differ are the ones the four ops compute.
    divergence = json.loads(reports["plain"].read_text())["devices"]["cpu"][
        "divergence"
    ]
    assert divergence["step"] == 0


# TensorFlow's own Erfc and exact GELU over a sweep of float32 values, as
# digests of their bits, without tfdet.
_ERFC_DIGESTS = """
import hashlib, json
import numpy as np
import tensorflow as tf
x = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
x = tf.constant(x[np.isfinite(x) & (np.abs(x) < 12)])
print(json.dumps({
    name: hashlib.sha256(function(x).numpy().tobytes()).hexdigest()
    for name, function in [
        ("erfc", tf.math.erfc),
        ("gelu", lambda v: tf.nn.gelu(v, approximate=False)),
    ]
}))
"""


def test_tensorflows_erfc_follows_the_cpu_model_from_2_20_only():
    # The version range of the hazard table's Erfc row, which decides where
    # enable() installs portable_erfc: from 2.20 the kernel takes RCPPS
    # (other bits emulated), before it does not (the same bits). Measured
    # on 2.16-2.21; each combination of the version matrix runs this.
    digests = {}
    for where, launcher in (
        ("native", []),
        ("emulated", _emulation.launcher("Haswell-v4")),
    ):
        result = subprocess.run(
            [*launcher, sys.executable, "-c", _ERFC_DIGESTS],
            env=clean_env(TF_ENABLE_ONEDNN_OPTS="0"),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        digests[where] = last_json_line(result.stdout)
    for name in ("erfc", "gelu"):
        differ = digests["native"][name] != digests["emulated"][name]
        assert differ == ERFC_FOLLOWS_THE_CPU, name
    version = ".".join(map(str, TENSORFLOW_RELEASE))
    assert _hazards.needs_patch(("Erfc",), version) == ERFC_FOLLOWS_THE_CPU


def test_cpuid_sees_the_emulated_vendor():
    code = "from tfdet._pin import _cpuid; print(_cpuid.vendor())"
    model = _emulation.default_model()
    emulated = subprocess.run(
        [*_emulation.launcher(model), sys.executable, "-c", code],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout.strip()
    assert emulated != _cpuid.vendor()
    assert emulated in ("GenuineIntel", "AuthenticAMD")


@pytest.mark.parametrize(
    ("model", "why", "flags"),
    [
        ("Skylake-Server-v4", "AVX-512", ()),
        ("Pentium-MMX-9000", "does not know it", ()),
        # No ISA cap to lack without tfdet, but TensorFlow itself needs AVX:
        # the run died of SIGILL and the report still claimed the emulation.
        ("Nehalem-v2", "has no AVX, which TensorFlow", ("--no-enable",)),
    ],
)
def test_a_model_that_cannot_run_emulated_is_a_usage_error(model, why, flags):
    proc = run_tfdet("check", *flags, "--emulate-cpu", model, "--steps", "1")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert why in proc.stderr and "Models that fit: " in proc.stderr
    assert "Haswell-v4" in proc.stderr
