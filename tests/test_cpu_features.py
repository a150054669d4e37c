"""TensorFlow's view of the CPU's extensions, capped with oneDNN's ISA.

Each case runs in a fresh process: the view is process state of
TensorFlow's library.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import clean_env, last_json_line, run_python
from tfdet._pin import _cpu_features, _isa

pytestmark = pytest.mark.skipif(
    _cpu_features.unavailable() is not None,
    reason=f"no CPU description to cap here: {_cpu_features.unavailable()}",
)

# Caps TensorFlow's view at CAP, then puts it back; prints what TensorFlow's
# own TestCPUFeature answered for every extension at each stage.
_PROBE = r"""
import json, sys
from tfdet._pin import _cpu_features
test, _ = _cpu_features._accessors()
def answers():
    return {flag: bool(test(f)) for f, flag in _cpu_features.EXTENSIONS.items()}
before = answers()
_cpu_features.VIEW.cap = sys.argv[1]
capped, hidden = answers(), list(_cpu_features.VIEW.hidden())
_cpu_features.VIEW.cap = None
print(json.dumps({"before": before, "capped": capped, "hidden": hidden,
                  "restored": answers()}))
"""


def test_flags_allowed_accumulate_the_levels_up_to_the_cap():
    assert _isa.flags_allowed("AVX2") == {"sse4_1", "avx", "avx2"}
    assert "avx512_bf16" in _isa.flags_allowed("AVX512_CORE_BF16")
    assert "avx512_bf16" not in _isa.flags_allowed("AVX512_CORE")
    assert _isa.flags_allowed("ALL") is None


@pytest.mark.parametrize("cap", ["AVX", "AVX2"])
def test_tensorflow_sees_only_the_extensions_the_cap_allows(cap):
    proc = run_python(_PROBE.replace("sys.argv[1]", repr(cap)), env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json_line(proc.stdout)
    allowed = _isa.flags_allowed(cap)
    # TensorFlow saw this CPU's own extensions (as /proc/cpuinfo lists them).
    flags = _isa.cpu_flags()
    assert result["before"] == {flag: flag in flags for flag in result["before"]}
    expected_hidden = sorted(
        f for f in result["before"] if f in flags and f not in allowed
    )
    assert sorted(result["hidden"]) == expected_hidden
    # Capped: exactly the allowed ones the CPU has; every other answer kept.
    assert result["capped"] == {
        flag: present and flag in allowed for flag, present in result["before"].items()
    }
    assert result["restored"] == result["before"]
    if cap == "AVX":
        # Every x86-64 CPU this suite runs on has AVX2: something was hidden.
        assert "avx2" in result["hidden"], json.dumps(result)
