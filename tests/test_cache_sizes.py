"""Cache sizes: the `caches` perturbation (an imitation) and the Eigen pin.

Bits cross processes here: every claim about what cache sizes do to the
bits is a `tfdet check` of fresh processes, each paired with its control (the
same perturbation that changes the bits where nothing pins Eigen's sizes).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, run_python, run_tfdet
from tfdet._pin import _cache_sizes, _isa
from tfdet.patches.eigen_cache_sizes import PINNED

SURVEY = REPO / "benchmarks" / "survey_models.py"

pytestmark = pytest.mark.skipif(
    _cache_sizes.imitation_unavailable() is not None,
    reason=f"caches perturbation: {_cache_sizes.imitation_unavailable()}",
)


def _check(
    target: str, *args: str, tmp_path, env: dict[str, str]
) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    proc = run_tfdet(
        "check",
        target,
        "--perturb",
        "caches",
        *args,
        "--json",
        str(report_path),
        env=env,
    )
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


# A profile written out by hand for the runs without tfdet: one thread per
# pool and oneDNN capped at AVX2, so the runs differ in the cache sizes only.
_ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def test_geometries_are_real_cpus_other_than_this_one():
    own = _cache_sizes.this_cpu()
    others = _cache_sizes.others()
    assert others and all((g.l1d, g.l2) != own for g in others)
    geometry = others[0]
    assert _cache_sizes.Geometry.from_env(geometry.to_env()) == geometry
    assert "L1d" in geometry.describe() and geometry.name in geometry.describe()


@pytest.mark.parametrize(
    "own, first",
    [
        ((32 * 1024, 1024 * 1024), "Intel Xeon Sapphire Rapids"),  # Zen 4
        ((48 * 1024, 1024 * 1024), "AMD EPYC Zen 4"),  # Zen 5: the Xeon's L1d
        ((48 * 1024, 2048 * 1024), "AMD EPYC Zen 4"),  # the Xeon itself
    ],
)
def test_the_first_geometry_imitated_has_another_l1d(monkeypatch, own, first):
    # Eigen blocks by the L1d size: a geometry that differs from this CPU in
    # L2 alone left the built-in CNN's bits unchanged on a Zen 5.
    monkeypatch.setattr(_cache_sizes, "this_cpu", lambda: own)
    others = _cache_sizes.others()
    assert others[0].name == first and others[0].l1d != own[0]
    assert own not in [(g.l1d, g.l2) for g in others]


def test_eigen_products_follow_the_imitated_l1_unless_enable_pins_it():
    # One process: Eigen's sizes as CPUID gave them, an imitated Intel Xeon's,
    # then enable()'s pin, which the imitation must leave alone; and undone.
    proc = run_python(
        """
        import hashlib, json
        import numpy as np
        import tensorflow as tf
        from tfdet._pin import _cache_sizes
        from tfdet.patches import eigen_cache_sizes

        a = tf.random.stateless_normal([64, 4096], seed=[1, 2])
        w = tf.random.stateless_normal([4096, 64], seed=[3, 4])
        def digest():
            return hashlib.sha256(tf.matmul(a, w).numpy().tobytes()).hexdigest()
        facts = {"cpuid": _cache_sizes.eigen_sizes(), "own": digest()}
        intel = _cache_sizes.GEOMETRIES[0]
        facts["imitated"] = _cache_sizes.imitate(intel)
        facts["intel"] = digest()
        eigen_cache_sizes.PATCH.install()
        facts["pinned_sizes"] = _cache_sizes.eigen_sizes()
        facts["pinned"] = digest()
        facts["left"] = _cache_sizes.imitate(intel)
        facts["pinned_after_imitation"] = digest()
        eigen_cache_sizes.PATCH.restore()
        facts["restored"] = _cache_sizes.eigen_sizes()
        print(json.dumps(facts))
        """,
        env=clean_env(TF_ENABLE_ONEDNN_OPTS="0", **_ONE_THREAD),
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    pinned = (PINNED.l1d, PINNED.l2, PINNED.l3)
    assert any(item.startswith("Eigen") for item in facts["imitated"])
    assert any(item.startswith("oneDNN") for item in facts["imitated"])
    if facts["cpuid"][0] != 48 * 1024:  # This CPU's L1d is not the Xeon's.
        assert facts["intel"] != facts["own"]
    assert facts["pinned_sizes"] == list(pinned)
    assert all("pinned by tfdet" in item for item in facts["left"] if "Eigen" in item)
    assert facts["pinned_after_imitation"] == facts["pinned"]
    assert facts["restored"] == facts["cpuid"]


def test_check_caches_separates_eigen_products_without_tfdet(tmp_path):
    # oneDNN's custom ops off: TensorFlow's Conv2D and its gradients are
    # Eigen's products, blocked by the L1 size they are told.
    env = clean_env(TF_ENABLE_ONEDNN_OPTS="0", **_ONE_THREAD)
    code, report, output = _check(
        "builtin:cnn", "--no-enable", tmp_path=tmp_path, env=env
    )
    assert code == 1, output
    cpu = report["devices"]["cpu"]
    assert "caches" in report["imitated"]
    assert cpu["divergence"]["step"] == 0
    assert cpu["divergence"]["attribution"]["responsible"] == ["caches"]
    assert "imitated in Eigen's and oneDNN's CPUID results" in output
    # Control: the same processes without the perturbation agree.
    none = run_tfdet(
        "check", "builtin:cnn", "--no-enable", "--perturb", "none", env=env
    )
    assert none.returncode == 0, none.stdout + none.stderr


def test_enable_pins_what_mixed_bfloat16_would_take_from_the_caches(tmp_path):
    # Under the AVX2 cap, with TensorFlow's view of the CPU capped alike
    # (the tensorflow_cpu_extensions patch), bfloat16 products are Eigen's on
    # every CPU, so without the pin the imitated sizes change this model's
    # bits (the control: enable() with that patch alone), and under enable()
    # they do not.
    target = f"{SURVEY}:mixed_bfloat16"
    code, report, output = _check(target, tmp_path=tmp_path, env=clean_env())
    assert code == 0, output
    patches = report["devices"]["cpu"]["runs"][0]["profile"]["patches"]
    assert {"eigen_cache_sizes", "tensorflow_cpu_extensions"} <= set(patches)
    (tmp_path / "unpinned").mkdir()
    code, report, output = _check(
        target,
        "--patches",
        "tensorflow_cpu_extensions",
        tmp_path=tmp_path / "unpinned",
        env=clean_env(),
    )
    assert code == 1, output
    assert report["devices"]["cpu"]["divergence"]["attribution"]["responsible"] == [
        "caches"
    ]


@pytest.mark.skipif(
    not {"avx512f", "avx_ne_convert"} & _isa.cpu_flags(),
    reason="TensorFlow sends bfloat16 ops to oneDNN only on a CPU with AVX-512F "
    "or AVX-NE-CONVERT; this one has neither",
)
def test_without_the_capped_view_bfloat16_fails_under_the_avx2_cap(tmp_path):
    # The control of the test above on a CPU where it matters: the same cap
    # written by hand, TensorFlow's view left as the CPU reports it.
    env = clean_env(TF_ENABLE_ONEDNN_OPTS="1", ONEDNN_MAX_CPU_ISA="AVX2", **_ONE_THREAD)
    code, _, output = _check(
        f"{SURVEY}:mixed_bfloat16", "--no-enable", tmp_path=tmp_path, env=env
    )
    assert code == 3, output
    assert "could not create a primitive descriptor" in output


@pytest.mark.skipif(
    not {"avx512f", "avx_ne_convert"} & _isa.cpu_flags(),
    reason="TensorFlow sends bfloat16 ops to oneDNN only on a CPU with AVX-512F "
    "or AVX-NE-CONVERT; this one has neither",
)
def test_the_cap_holds_tensorflows_view_without_any_patch():
    # enable(patches=None) installs no patch, yet its AVX2 cap holds
    # TensorFlow's view of the CPU as the patch does: the control above
    # aborts, this trains (a MatMul and a Conv2D in bfloat16).
    result = run_python(
        """
        import tfdet
        tfdet.enable(patches=None)
        import keras, numpy as np
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(4)])
        model.compile("sgd", "mse")
        x = np.random.default_rng(0).standard_normal((32, 8, 8, 3))
        model.fit(x, np.zeros((32, 4)), verbose=0)
        print("trained")
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained" in result.stdout


def test_symbols_are_searched_once_per_library_file_and_kept(tmp_path, monkeypatch):
    # A copy of TensorFlow's framework library (it names Eigen's variable).
    library = tmp_path / "libtensorflow_framework.so.2"
    tensorflow = Path(_cache_sizes._tensorflow_directory())
    shutil.copyfile(tensorflow / library.name, library)
    installed = library.stat().st_mtime_ns
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kept = tmp_path / "cache" / "tfdet" / "symbols"
    names = _cache_sizes._EIGEN
    searched = _cache_sizes._elf_symbols(str(library), names)
    assert set(searched) == set(names)
    assert _cache_sizes._kept_symbols(str(library), names) == searched
    assert len(list(kept.iterdir())) == 1

    def search_again(*args):
        raise AssertionError("searched again")

    monkeypatch.setattr(_cache_sizes, "_elf_symbols", search_again)
    assert _cache_sizes._kept_symbols(str(library), names) == searched
    # Another file at the same path (TensorFlow installed again), other
    # names, and a damaged entry are searched again.
    os.utime(library, ns=(installed + 10**9,) * 2)
    with pytest.raises(AssertionError, match="searched again"):
        _cache_sizes._kept_symbols(str(library), names)
    os.utime(library, ns=(installed,) * 2)
    with pytest.raises(AssertionError, match="searched again"):
        _cache_sizes._kept_symbols(str(library), names[:2])
    negative = json.dumps({names[0]: [-1, 8]})
    for damaged in ("{", negative, '{"other": [1, 8]}', "[]"):
        (entry,) = kept.iterdir()
        entry.write_text(damaged)
        with pytest.raises(AssertionError, match="searched again"):
            _cache_sizes._kept_symbols(str(library), names)
    entry.write_text(json.dumps({name: list(pair) for name, pair in searched.items()}))
    assert _cache_sizes._kept_symbols(str(library), names) == searched
