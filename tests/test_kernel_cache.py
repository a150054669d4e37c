"""tfdet's compiled kernels: found without a compiler, and named in the profile.

The cache is keyed by what a library's code depends on (TensorFlow's build,
the architecture, the source, the flags), so a build made once serves a
process without a compiler, in another environment. And because a kernel
patch whose kernel cannot load computes its ops as a composition with other
bits, the profile says which patches ran on kernels: two processes, one with
the kernel and one without, differ in their profiles as well as in their
product's bits (the control: the bits do differ, so the field is needed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, last_json_line
from tfdet import Profile
from tfdet._kernels import build as kernel_build
from tfdet._kernels import fixed_order
from tfdet._kernels import library as kernel_library

# A product whose bits the kernel and the pool-size-free composition give
# differently (K of 4096: oneDNN's convolution splits the sum; shapes whose K
# fits one block can agree), its digest, and the profile.
PRODUCT = """
import hashlib, json
import numpy as np
import tfdet
profile = tfdet.enable(seed=0, threads=2, patches=["auto", "fixed_order_products"])
import tensorflow as tf
rng = np.random.default_rng(0)
a = tf.constant(rng.normal(size=(32, 4096)), tf.float32)
b = tf.constant(rng.normal(size=(4096, 64)), tf.float32)
c = tf.function(tf.matmul)(a, b).numpy()
print(json.dumps({"digest": hashlib.sha256(c.tobytes()).hexdigest()[:16],
                  "profile": profile.to_dict()}))
"""


@pytest.fixture(scope="module")
def cached_build():
    """The fixed-order kernel built into the suite's shared cache."""
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: nothing can be built into the cache")
    return fixed_order.LIBRARY.build()


def _without_compiler(tmp_path, cache) -> dict[str, str]:
    """An environment whose PATH has no C++ compiler, with `cache` as the cache."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    return clean_env(
        PATH=str(empty), CXX=None, TFDET_KERNEL_CACHE=str(cache), PYTHONHASHSEED="0"
    )


@pytest.mark.slow
def test_without_a_compiler_the_cached_kernel_runs_and_the_profile_says_which(
    cached_build, tmp_path
):
    caches = {"cached": cached_build.parent.parent, "empty": tmp_path / "empty"}
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-c", PRODUCT],
            env=_without_compiler(tmp_path, cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, cache in caches.items()
    }
    found, stderr = {}, {}
    for name, process in processes.items():
        out, stderr[name] = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[name][-3000:]
        found[name] = last_json_line(out)
    cached = Profile.from_dict(found["cached"]["profile"])
    empty = Profile.from_dict(found["empty"]["profile"])
    # Both installed the patch; only the cached build's process ran its kernel.
    assert "fixed_order_products" in cached.patches
    assert cached.patches == empty.patches
    # The default's kernels, every one from the cache.
    assert "fixed_order_products" in cached.kernels
    assert empty.kernels == ()
    assert "unavailable" not in stderr["cached"]
    assert "no C++ compiler" in stderr["empty"]
    # The control: the composition's bits are other than the kernel's, and
    # the profiles tell the two runs apart by that field alone.
    assert found["cached"]["digest"] != found["empty"]["digest"]
    assert set(cached.differences(empty)) == {"kernels"}


def test_the_cache_key_follows_the_architecture_not_the_compiler(monkeypatch):
    pytest.importorskip("tensorflow")
    library = fixed_order.LIBRARY
    here = library.library_path()
    monkeypatch.setenv("CXX", "/opt/another/clang++")
    assert library.library_path() == here
    monkeypatch.setattr(kernel_library.platform, "machine", lambda: "aarch64")
    assert library.library_path() != here


def test_a_profile_recorded_before_kernels_existed_reads_as_unknown():
    data = Profile.from_dict(_a_profile_dict()).to_dict()
    del data["kernels"]
    assert Profile.from_dict(data).kernels is None
    data["kernels"] = ["fixed_order_products"]
    restored = Profile.from_dict(data)
    assert restored.kernels == ("fixed_order_products",)
    assert restored.to_dict()["kernels"] == ["fixed_order_products"]


def _a_profile_dict() -> dict:
    return {
        "seed": 0,
        "intra_op_threads": 2,
        "inter_op_threads": 1,
        "onednn_opts": True,
        "cpu_isa": "AVX2",
        "op_determinism": True,
        "xla_determinism": False,
        "python_hash_seed": "0",
        "patches": ["fixed_order_products"],
        "kernels": [],
        "keras": "keras3",
        "tensorflow_version": "2.21.0",
        "keras_version": "3.15.1",
        "numpy_version": "2.1.3",
        "python_version": "3.11.7",
    }


def test_a_failed_build_is_said_by_load_and_not_run_again(tmp_path, monkeypatch):
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: nothing can fail to build")
    source = tmp_path / "_broken.cc"
    source.write_text("this is not C++;\n")
    monkeypatch.setenv(kernel_library.CACHE_VARIABLE, str(tmp_path / "cache"))
    broken = kernel_library.KernelLibrary(source, fallback="the composition")
    (failure,) = kernel_library.build_together([broken, broken]).values()
    assert isinstance(failure, RuntimeError)
    assert "the build failed" in str(failure)

    def no_compiler_again(*args, **kwargs):
        raise AssertionError("the compiler ran a second time")

    monkeypatch.setattr(kernel_build.subprocess, "run", no_compiler_again)
    with pytest.raises(RuntimeError) as again:
        broken.build()
    assert again.value is failure
    assert broken.load() is None and not broken.loaded()


def test_install_builds_the_kernels_of_the_patches_it_installs_first(monkeypatch):
    from tfdet._patching import _registry

    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, fallback="-")
    order = []
    fake = _registry.Patch(
        name="fake_kernel_patch",
        summary="-",
        upstream="-",
        apply=lambda swap: order.append("apply"),
        kernel=library,
    )
    monkeypatch.setattr(_registry, "available", lambda: {fake.name: fake})
    monkeypatch.setattr(
        kernel_library,
        "build_together",
        lambda libraries: order.append(("built", list(libraries))),
    )
    try:
        assert _registry.install([fake.name]) == (fake.name,)
        assert order == [("built", [library]), "apply"]
        # Installed already: nothing to build again.
        _registry.install([fake.name])
        assert order[-1] == ("built", [])
    finally:
        fake.restore()


def test_a_cache_that_cannot_be_made_falls_back_as_a_missing_compiler_does(
    tmp_path, monkeypatch, caplog
):
    pytest.importorskip("tensorflow")
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    monkeypatch.setenv(kernel_library.CACHE_VARIABLE, str(in_the_way))
    library = kernel_library.KernelLibrary(
        fixed_order.LIBRARY.source, fallback="the composition instead"
    )
    (failure,) = kernel_library.build_together([library]).values()
    assert isinstance(failure, OSError)
    with caplog.at_level("WARNING", logger="tfdet"):
        assert library.load() is None
    assert "the composition instead" in caplog.text


@pytest.mark.slow
def test_a_damaged_cached_library_is_refused_with_a_message_not_a_sigbus(
    cached_build, tmp_path
):
    # A cached library cut short (an interrupted copy, a full disk): before,
    # an entry was trusted because its file existed, and every later process
    # died with SIGBUS inside tf.load_op_library. The control shows that
    # loading such a file does kill the process.
    cache = tmp_path / "cache"
    shutil.copytree(cached_build.parent, cache / cached_build.parent.name)
    damaged = cache / cached_build.parent.name / cached_build.name
    with open(damaged, "r+b") as library:
        library.truncate(damaged.stat().st_size // 2)
    control = subprocess.run(
        [sys.executable, "-c",
         f"import tensorflow as tf; tf.load_op_library({str(damaged)!r})"],
        env=clean_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert control.returncode != 0  # -SIGBUS, or an error where mmap holds.

    process = subprocess.run(
        [sys.executable, "-c", PRODUCT],
        env=_without_compiler(tmp_path, cache),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-3000:]
    assert Profile.from_dict(last_json_line(process.stdout)["profile"]).kernels == ()
    assert "is damaged (its SHA-256 is" in process.stderr
    assert "delete" in process.stderr


def test_a_damaged_library_is_built_again_and_its_checksum_recorded(
    tmp_path, monkeypatch
):
    pytest.importorskip("tensorflow")
    monkeypatch.setenv(kernel_library.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_library, "compiler", lambda: "/usr/bin/fake-c++")
    builds = []

    def fake_compiler(command, **kwargs):  # Writes what `-o` names.
        builds.append(command)
        Path(command[command.index("-o") + 1]).write_bytes(b"\x7fELF whole library")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(kernel_build.subprocess, "run", fake_compiler)
    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, fallback="-")
    path = library.build()
    assert kernel_build.damage(path) is None and len(builds) == 1
    # Whole: found, not built again.
    assert kernel_library.KernelLibrary(library.source, "-").build() == path
    assert len(builds) == 1
    path.write_bytes(b"\x7fELF who")  # Cut short.
    assert "SHA-256" in kernel_build.damage(path)
    assert kernel_library.KernelLibrary(library.source, "-").build() == path
    assert len(builds) == 2 and kernel_build.damage(path) is None
    # An entry from before checksums were recorded is not trusted either.
    kernel_build.digest_path(path).unlink()
    assert "no checksum" in kernel_build.damage(path)


def test_a_compiler_that_writes_nothing_is_named_as_not_a_compiler(
    tmp_path, monkeypatch
):
    # Before: CXX=/bin/true "built" nothing, and the move into the cache
    # said "No such file or directory".
    pytest.importorskip("tensorflow")
    monkeypatch.setenv(kernel_library.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "/bin/true")
    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, fallback="-")
    with pytest.raises(RuntimeError, match="exited 0 but wrote no library") as error:
        library.build()
    assert "is it a C++ compiler?" in str(error.value)


def test_the_flags_a_wheel_is_built_with_are_tensorflows_own():
    # The wheel's build reads no TensorFlow through Python: its flags are
    # what the installed TensorFlow's sysconfig says, but for the paths.
    tf = pytest.importorskip("tensorflow")
    compile_flags = [
        f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")
    ]
    assert tuple(compile_flags) == kernel_build.TENSORFLOW_COMPILE_FLAGS
    assert f"-l:{kernel_build.FRAMEWORK_LIBRARY}" in tf.sysconfig.get_link_flags()
    site = Path(tf.sysconfig.get_lib()).parent
    assert kernel_build.find_tensorflow(site) == (tf.__version__, site / "tensorflow")


def _ship(shipped: Path, library, origin: str = "wheel") -> Path:
    """A shipped directory for this TensorFlow holding a copy of `library`'s
    cached build, as a wheel's build lays it out."""
    import tensorflow as tf

    directory = shipped / kernel_build.shipped_directory(tf.__version__).name
    directory.mkdir(parents=True)
    target = directory / f"{library.name}.so"
    built = library.build()
    shutil.copy(built, target)
    shutil.copy(kernel_build.digest_path(built), kernel_build.digest_path(target))
    manifest = {
        "origin": origin,
        "sources": {library.name: kernel_build.source_key(library.source)},
    }
    (directory / kernel_build.MANIFEST).write_text(json.dumps(manifest))
    return target


def test_a_shipped_library_is_taken_first_and_only_when_whole_and_current(
    cached_build, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(kernel_build, "SHIPPED", tmp_path / "lib")
    target = _ship(tmp_path / "lib", fixed_order.LIBRARY, origin="install")
    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, fallback="-")
    assert library.build() == target and library.origin() == "install"
    assert library.where() == f"install {target}"
    # Damaged (cut short): not loaded, said once; the cache serves instead.
    target.write_bytes(target.read_bytes()[:1000])
    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, fallback="-")
    with caplog.at_level("WARNING", logger="tfdet"):
        assert library.build() == cached_build and library.origin() == "cache"
        library.shipped()
    assert caplog.text.count("is not used: its SHA-256 is") == 1
    # Built from other sources (a checkout edited since): quietly not used.
    manifest = target.parent / kernel_build.MANIFEST
    manifest.write_text(
        json.dumps({"origin": "wheel", "sources": {"fixed_order_products": "0"}})
    )
    assert kernel_library.KernelLibrary(library.source, "-").shipped() is None


def test_a_shipped_library_is_within_reach_without_a_compiler(
    cached_build, tmp_path, monkeypatch
):
    # `tfdet cost` times the kernels' rows where they are within reach; it
    # asked for a compiler alone, so an install with the kernels and no
    # compiler timed no kernel row.
    tf = pytest.importorskip("tensorflow")
    assert kernel_library._tensorflow_version() == tf.__version__
    monkeypatch.setattr(kernel_build, "SHIPPED", tmp_path / "lib")
    monkeypatch.setattr(kernel_library, "compiler", lambda: None)
    library = kernel_library.KernelLibrary(fixed_order.LIBRARY.source, "-")
    assert not library.within_reach()
    _ship(tmp_path / "lib", fixed_order.LIBRARY)
    assert library.within_reach()
