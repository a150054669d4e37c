"""What shipping the kernels changes for a user: install, import, first step, speed.

Two fresh virtual environments, side by side, that see this Python's
TensorFlow (a `.pth` line, so nothing is installed twice) but not the
checkout, and no C++ compiler on PATH for the runs:

- `first use` (before): tfdet's wheel without kernels
  (`TFDET_BUILD_KERNELS=0`), as every install was: the first `enable()`
  with the kernel patches compiles them (a compiler is on PATH for it);
- `shipped` (after): tfdet installed from source with `pip install .`, as
  the README's command does: the kernels compiled into the wheel at install.

For each: the install's wall time (`pip install --no-deps` from the
checkout, its build isolated as a user's is), the wheel's size, then in
fresh processes with an empty kernel cache: `import tfdet`, `tfdet.enable()`
with the fixed-order products and convolutions and the portable kernels,
the first step of the built-in CNN, and a 512x4096 @ 4096x512 product by
the kernel (median of 20), so that the shipped kernels' speed is set beside
the ones built here.

    python benchmarks/kernel_install.py [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One process: the times of its import, enable(), first step and a product.
PROBE = """
import time
started = time.perf_counter()
import tfdet
imported = time.perf_counter()
profile = tfdet.enable(seed=0, threads=2, patches=[
    "auto", "fixed_order_products", "fixed_order_convolutions", "portable_kernels"])
enabled = time.perf_counter()
import json, statistics
import numpy as np
import tensorflow as tf
from tfdet._kernels import fixed_order
from tfdet._target import _builtins
model = _builtins.cnn()
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 32, 32, 3)).astype("float32")
y = np.eye(10, dtype="float32")[rng.integers(0, 10, 32)]
before_step = time.perf_counter()
model.train_on_batch(x, y)
stepped = time.perf_counter()
a = tf.constant(rng.normal(size=(512, 4096)), tf.float32)
b = tf.constant(rng.normal(size=(4096, 512)), tf.float32)
fixed_order.matmul(a, b)
product = []
for _ in range(20):
    t = time.perf_counter(); fixed_order.matmul(a, b).numpy()
    product.append(time.perf_counter() - t)
print(json.dumps({"import_s": imported - started, "enable_s": enabled - imported,
                  "first_step_s": stepped - before_step,
                  "product_ms": 1000 * statistics.median(product),
                  "kernel_origins": dict(profile.kernel_origins),
                  "kernels": list(profile.kernels)}))
"""


def fresh_environment(root: Path) -> tuple[Path, Path]:
    """A venv with this Python's site-packages after its own; (python, site)."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


def install(python: Path, tree: Path, kernels: bool) -> float:
    """`pip install --no-deps` of the tree into the venv; its wall seconds."""
    env = {**os.environ, "TFDET_BUILD_KERNELS": "1" if kernels else "0"}
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", str(tree)],
        env=env, check=True,
    )  # fmt: skip
    return time.monotonic() - started


def probe(python: Path, scratch: Path, with_compiler: bool) -> dict:
    """One fresh process's times, with an empty kernel cache."""
    cache = Path(tempfile.mkdtemp(dir=scratch))
    path = os.environ["PATH"] if with_compiler else str(scratch / "no-compilers")
    (scratch / "no-compilers").mkdir(exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXX")},
        "PATH": path,
        "TFDET_KERNEL_CACHE": str(cache),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    done = subprocess.run(
        [str(python), "-I", "-c", PROBE], env=env, cwd=scratch,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tfdet-kernel-install-"))
    tree = scratch / "tree"
    shutil.copytree(
        REPO, tree,
        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "lib"),
    )  # fmt: skip
    ways = {"first use": False, "shipped": True}
    environments = {
        way: fresh_environment(scratch / way.replace(" ", "-")) for way in ways
    }
    results: dict[str, dict] = {}
    for way, kernels in ways.items():
        python, site = environments[way]
        seconds = install(python, tree, kernels)
        shipped = sorted(
            p.name for p in (site / "tfdet" / "_kernels").glob("lib/*/*.so")
        )
        results[way] = {
            "install_s": round(seconds, 1),
            "shipped": shipped,
            "rounds": [],
        }
    for _ in range(args.rounds):
        for way, kernels in ways.items():
            # Before, the compiler must be there for the first use to build.
            found = probe(environments[way][0], scratch, with_compiler=not kernels)
            results[way]["rounds"].append(found)
    print(
        f"{'':12}{'install':>9}{'import':>8}{'enable':>8}{'1st step':>9}{'product':>9}"
    )
    for way, found in results.items():
        rounds = found["rounds"]

        def median(key: str, rounds: list = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        print(
            f"{way:12}{found['install_s']:8.1f}s{median('import_s'):7.2f}s"
            f"{median('enable_s'):7.2f}s{median('first_step_s'):8.2f}s"
            f"{median('product_ms'):7.1f}ms  {rounds[-1]['kernel_origins']}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
