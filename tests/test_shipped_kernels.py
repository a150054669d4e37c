"""tfdet's wheel carries its kernels: a process with no compiler trains with them.

The wheel is built from this checkout as a user's `pip install .` builds it
(pip's isolated build, the kernels compiled against the TensorFlow installed
here), installed into a fresh virtual environment that sees this
environment's TensorFlow but not the checkout, and run where no C++ compiler
can be found (none on PATH, CXX pointing nowhere) and the kernel cache is
empty. Its training digest must equal the one this environment's own build
(the cache, compiled at first use) gives, and the control, the same fresh
environment without the wheel's kernels, must give other bits.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import REPO, clean_env, last_json_line
from tfdet._kernels import build as kernel_build
from tfdet._kernels import library as kernel_library

pytestmark = pytest.mark.slow

# A few steps of the built-in CNN under the fixed-order products and
# convolutions: its weights' digest and the profile.
TRAIN = """
import hashlib, json
import numpy as np
import tfdet
profile = tfdet.enable(seed=0, threads=2, patches=[
    "auto", "fixed_order_products", "fixed_order_convolutions"])
from tfdet._target import _builtins
model = _builtins.cnn()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 32, 32, 3)).astype("float32")
y = np.eye(10, dtype="float32")[rng.integers(0, 10, 64)]
model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights()))
print(json.dumps({"digest": digest.hexdigest()[:16], "profile": profile.to_dict(),
                  "tfdet": tfdet.__file__}))
"""


def _tree_without_builds(destination: Path) -> Path:
    """The checkout's files, copied (a build in the checkout itself would
    collide with CI's other installs of it)."""
    ignored = shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "lib", "site"
    )
    shutil.copytree(REPO, destination, ignore=ignored)
    return destination


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """tfdet's wheel, built from a copy of this checkout."""
    if kernel_library.compiler() is None:
        pytest.skip("no C++ compiler: the wheel's build would hold no kernel")
    root = tmp_path_factory.mktemp("wheel")
    tree = _tree_without_builds(root / "tree")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         "--disable-pip-version-check", "--wheel-dir", str(root / "dist"), str(tree)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = (root / "dist").glob("tfdet-*.whl")
    return found


def _fresh_environment(root: Path, wheel: Path | None) -> Path:
    """A virtual environment with tfdet from `wheel` (or the checkout's files
    without any kernel library, for the control), and this environment's
    site-packages after its own (TensorFlow, Keras, NumPy)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True
    )
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    if wheel is None:
        shutil.copytree(
            REPO / "tfdet", site / "tfdet", ignore=shutil.ignore_patterns("lib")
        )
    else:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
             "--disable-pip-version-check", "--target", str(site), str(wheel)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    # A .pth line adds a directory without reading the .pth files in it, so
    # this environment's editable install of the checkout stays out.
    (site / "tensorflow_from_ci.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return python


def _no_compiler(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "bin-without-compilers"
    empty.mkdir(exist_ok=True)
    return clean_env(
        PATH=str(empty),
        CXX="/nonexistent/g++",
        TFDET_KERNEL_CACHE=str(tmp_path / "empty-cache"),
        PYTHONPATH=None,
        PYTHONHASHSEED="0",
    )


def _train(python: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(python), "-c", TRAIN], env=env, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_the_wheels_kernels_train_without_a_compiler_to_the_compiled_bits(
    wheel, tmp_path
):
    # What the wheel holds: one directory for this TensorFlow and machine.
    import tensorflow as tf

    shipped = (
        f"tf{kernel_build.minor(tf.__version__)}-{kernel_build.platform.machine()}"
    )
    names = zipfile.ZipFile(wheel).namelist()
    assert any(f"_kernels/lib/{shipped}/fixed_order_products.so" in n for n in names)
    fresh = _fresh_environment(tmp_path / "fresh", wheel)
    control = _fresh_environment(tmp_path / "control", None)
    runs = {
        "wheel": _train(fresh, _no_compiler(tmp_path), tmp_path),
        "control": _train(control, _no_compiler(tmp_path), tmp_path),
        # This environment: the kernels compiled at first use into the cache.
        "compiled": _train(Path(sys.executable), clean_env(PYTHONHASHSEED="0"), REPO),
    }
    found, errors = {}, {}
    for name, process in runs.items():
        out, errors[name] = process.communicate(timeout=600)
        assert process.returncode == 0, f"{name}: {errors[name][-3000:]}"
        found[name] = last_json_line(out)
    wheel_profile, compiled_profile = (
        found[n]["profile"] for n in ("wheel", "compiled")
    )
    assert found["wheel"]["tfdet"].startswith(str(tmp_path / "fresh"))
    assert {"fixed_order_convolutions", "fixed_order_products"} <= set(
        wheel_profile["kernels"]
    )
    # Every library from the install (the wheel), or every one from the cache.
    assert wheel_profile["kernel_origins"]["fixed_order_products"] == "install"
    assert set(wheel_profile["kernel_origins"].values()) == {"install"}
    assert set(compiled_profile["kernel_origins"].values()) == {"cache"}
    assert "unavailable" not in errors["wheel"]
    assert found["wheel"]["digest"] == found["compiled"]["digest"]
    # The control: no kernel found (no compiler, none shipped), other bits.
    assert found["control"]["profile"]["kernels"] == []
    assert "no C++ compiler" in errors["control"]
    assert found["control"]["digest"] != found["wheel"]["digest"]


def test_the_wheels_kernel_digests_equal_the_x86_64_record(wheel, tmp_path):
    if kernel_build.platform.machine() != "x86_64":
        pytest.skip("the record's reference entry is x86-64's")
    fresh = _fresh_environment(tmp_path / "fresh", wheel)
    # A copy of the benchmark beside its record, out of the checkout (it puts
    # its parent's parent on sys.path, for the checkout's tfdet).
    bench = tmp_path / "bench" / "benchmarks"
    bench.mkdir(parents=True)
    for name in ("fixed_order_digests.py", "fixed_order_digests.json"):
        shutil.copy(REPO / "benchmarks" / name, bench / name)
    done = subprocess.run(
        [str(fresh), str(bench / "fixed_order_digests.py")], env=_no_compiler(tmp_path),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernel digests equal x86_64's" in done.stdout, done.stdout
    found = json.loads(done.stdout[: done.stdout.index("\n}\n") + 3])
    assert (
        found["x86_64"]["kernel"]
        == json.loads((REPO / "benchmarks" / "fixed_order_digests.json").read_text())[
            "x86_64"
        ]["digests"]["kernel"]
    )


def _runtime_needs(library: Path) -> dict[str, Version]:
    """The newest version of each of glibc, libstdc++ and the C++ ABI that
    `library` asks for, by `objdump -T`."""
    table = subprocess.run(
        ["objdump", "-T", str(library)], capture_output=True, text=True, check=True
    ).stdout
    newest: dict[str, Version] = {}
    for name, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\b", table):
        newest[name] = max(newest.get(name, Version("0")), Version(version))
    return newest


def test_the_wheels_libraries_need_no_newer_runtime_than_tensorflow(wheel, tmp_path):
    # Built here by GCC 12 without src/runtime_floor.h, they needed
    # GLIBCXX_3.4.29 and 3.4.30, where TensorFlow 2.21 needs 3.4.22.
    if shutil.which("objdump") is None:
        pytest.skip("no objdump (binutils)")
    import tensorflow as tf

    theirs = _runtime_needs(
        Path(tf.sysconfig.get_lib()) / kernel_build.FRAMEWORK_LIBRARY
    )
    with zipfile.ZipFile(wheel) as archive:
        libraries = [n for n in archive.namelist() if n.endswith(".so")]
        archive.extractall(tmp_path, libraries)
    assert len(libraries) == len(kernel_build.libraries_for())
    for name in libraries:
        mine = _runtime_needs(tmp_path / name)
        newer = {
            runtime: (str(version), str(theirs[runtime]))
            for runtime, version in mine.items()
            if version > theirs[runtime]
        }
        assert newer == {}, f"{name} needs a newer runtime than TensorFlow: {newer}"
