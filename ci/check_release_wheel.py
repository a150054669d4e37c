"""A release wheel's kernels, used on every TensorFlow minor where no compiler is.

Usage (after `python3 ci/build_wheel.py --machines x86_64`; stdlib only):

    python3 ci/check_release_wheel.py dist/tfdet-*_x86_64.whl [--minors 2.16,2.21]

For each minor (by default every one of `ci/matrix.py`'s MINORS) it makes a
virtual environment with that minor's newest `tensorflow-cpu` (kept in
`--work` for the next run), installs the wheel into it, and runs
`benchmarks/fixed_order_digests.py` there from outside the checkout, with
no C++ compiler on PATH, `CXX` pointing nowhere and an empty kernel cache:
the kernels must come from the wheel (the profile's origin "wheel") and
give the digests recorded on x86-64. Prints one line per minor; exits 1
if any minor's kernels are missing or give other bits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
from matrix import MINORS  # noqa: E402

# Run where the wheel is installed: the digests, the vector path and where
# the library came from.
PROBE = """
import importlib.util, json, sys
from tfdet._kernels import fixed_order
spec = importlib.util.spec_from_file_location("digests", sys.argv[1])
digests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digests)
import tensorflow as tf
found = digests.digests()
print(json.dumps({"tensorflow": tf.__version__, "kernel": found["kernel"],
                  "recorded": digests.recorded()["x86_64"]["digests"]["kernel"],
                  "origin": fixed_order.LIBRARY.origin(),
                  "path": fixed_order.vector_path()}))
"""


def environment(minor: str, work: Path) -> Path:
    """A venv with the minor's newest tensorflow-cpu; its python."""
    venv = work / f"tf{minor}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", f"tensorflow-cpu=={minor}.*"],
            check=True,
        )  # fmt: skip
    return python


def check(python: Path, wheel: Path, scratch: Path) -> dict:
    """Installs `wheel` and runs the probe without a compiler."""
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--force-reinstall", "--no-deps", str(wheel)],
        check=True,
    )  # fmt: skip
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "absl-py", "packaging"],
        check=True,
    )  # fmt: skip
    bench = scratch / "benchmarks"
    bench.mkdir(exist_ok=True)
    for name in ("fixed_order_digests.py", "fixed_order_digests.json"):
        shutil.copy(REPO / "benchmarks" / name, bench / name)
    (scratch / "bin").mkdir(exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": str(scratch / "bin"),
        "CXX": "/nonexistent/g++",
        "TFDET_KERNEL_CACHE": tempfile.mkdtemp(dir=scratch),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    done = subprocess.run(
        [str(python), "-I", "-c", PROBE, str(bench / "fixed_order_digests.py")],
        env=env, cwd=scratch, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--minors", default=",".join(MINORS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/tfdet-wheel-check"))
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    failed = False
    for minor in args.minors.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            found = check(
                environment(minor, args.work), args.wheel.resolve(), Path(scratch)
            )
        good = (
            "error" not in found
            and found["origin"] == "wheel"
            and found["kernel"] == found["recorded"]
        )
        failed |= not good
        print(
            f"TensorFlow {minor}: {'ok' if good else 'FAILED'} {json.dumps(found)}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
