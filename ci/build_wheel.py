"""tfdet's release wheels: one per machine, with the kernels for every TensorFlow minor.

Usage (from anywhere, Python 3.10+ with pip; g++, and for aarch64 Debian's
`g++-aarch64-linux-gnu` cross compiler; stdlib only):

    python3 ci/build_wheel.py                       # x86_64 and aarch64, every minor
    python3 ci/build_wheel.py --machines x86_64 --minors 2.21 --out dist

For each machine and each TensorFlow minor of the version matrix
(`ci/matrix.py`'s MINORS) it downloads that minor's newest TensorFlow wheel
for the machine (`tensorflow-cpu` on x86-64, `tensorflow` on aarch64; no
dependencies, for Python 3.11: the C++ side is the same for every Python),
unpacks its C++ headers and framework library, and compiles tfdet's kernels
against them (`tfdet/_kernels/build.py`). Then one wheel per machine holds
them all, tagged `manylinux_2_<N>_<machine>` with N the newest glibc that
the libraries ask for (`objdump -T`), which it prints with libstdc++'s and
the C++ ABI's beside TensorFlow's own. Downloads are kept in `--work` for a
second run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
import kernel_build  # noqa: E402
from matrix import MINORS  # noqa: E402

# The machine's C++ compiler and binutils' prefix, and its TensorFlow.
TOOLCHAIN = {"x86_64": "", "aarch64": "aarch64-linux-gnu-"}
DISTRIBUTION = {"x86_64": "tensorflow-cpu", "aarch64": "tensorflow"}
# The platform tags TensorFlow's wheels carry (2.16-2.20: manylinux2014,
# 2.21: manylinux_2_27); pip's --platform takes each as it is written.
PLATFORMS = ("manylinux2014_{}", "manylinux_2_17_{}", "manylinux_2_27_{}")


def tensorflow_site(machine: str, minor: str, work: Path) -> Path:
    """A directory with the minor's TensorFlow headers, framework library and
    metadata, unpacked from its wheel for `machine`."""
    site = work / f"site-{machine}-{minor}"
    if (site / "tensorflow").is_dir():
        return site
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--only-binary=:all:", "--python-version",
         "3.11", *(f"--platform={p.format(machine)}" for p in PLATFORMS), "--dest", str(wheels),
         f"{DISTRIBUTION[machine]}=={minor}.*"],
        check=True,
    )  # fmt: skip
    pattern = f"{DISTRIBUTION[machine].replace('-', '_')}-{minor}.*{machine}.whl"
    (wheel,) = sorted(p for p in wheels.glob("*.whl") if re.fullmatch(pattern, p.name))[
        -1:
    ]
    with zipfile.ZipFile(wheel) as archive:
        wanted = [
            name
            for name in archive.namelist()
            if name.startswith("tensorflow/include/")
            or name == "tensorflow/libtensorflow_framework.so.2"
            or name.endswith(".dist-info/METADATA")
        ]
        scratch = work / f".unpacking-{machine}-{minor}"
        shutil.rmtree(scratch, ignore_errors=True)
        archive.extractall(scratch, wanted)
    scratch.rename(site)
    return site


def runtime_needs(objdump: str, library: Path) -> dict[str, str]:
    """The newest GLIBC, GLIBCXX and CXXABI version `library` asks for."""
    table = subprocess.run(
        [objdump, "-T", str(library)], capture_output=True, text=True, check=True
    ).stdout
    newest: dict[str, tuple[int, ...]] = {}
    for name, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\b", table):
        parts = tuple(int(p) for p in version.split("."))
        newest[name] = max(newest.get(name, ()), parts)
    return {name: ".".join(map(str, v)) for name, v in sorted(newest.items())}


def build_machine(machine: str, minors: list[str], work: Path, out: Path) -> Path:
    """The kernels for every minor, then the wheel for `machine`; its path."""
    build = kernel_build.load()
    compiler = shutil.which(f"{TOOLCHAIN[machine]}g++")
    objdump = shutil.which(f"{TOOLCHAIN[machine]}objdump")
    if compiler is None or objdump is None:
        raise SystemExit(f"no {TOOLCHAIN[machine]}g++ or objdump for {machine}")
    shipped = work / f"lib-{machine}"
    shutil.rmtree(shipped, ignore_errors=True)
    newest_glibc = (2, 17)
    for minor in minors:
        started = time.monotonic()
        site = tensorflow_site(machine, minor, work)
        directory = build.build_shipped(compiler, site, "wheel", shipped, machine)
        print(f"{directory.name}: built in {time.monotonic() - started:.0f} s")
        framework = runtime_needs(
            objdump, site / "tensorflow" / build.FRAMEWORK_LIBRARY
        )
        print(f"  TensorFlow's framework library needs {framework}")
        for library in sorted(directory.glob("*.so")):
            needs = runtime_needs(objdump, library)
            size = library.stat().st_size
            print(f"  {library.name} ({size // 1024} KiB) needs {needs}")
            glibc = tuple(int(p) for p in needs.get("GLIBC", "2.17").split("."))
            newest_glibc = max(newest_glibc, glibc[:2])
    tag = f"manylinux_{newest_glibc[0]}_{newest_glibc[1]}_{machine}"
    env = {
        **os.environ,
        "TFDET_SHIPPED_KERNELS": str(shipped),
        "TFDET_WHEEL_PLATFORM": tag,
    }
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("tfdet-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--wheel-dir", str(out), str(REPO)],
        env=env, check=True,
    )  # fmt: skip
    (wheel,) = set(out.glob(f"tfdet-*{tag}.whl")) - before or out.glob(
        f"tfdet-*{tag}.whl"
    )
    print(f"{wheel.name}: {wheel.stat().st_size // 1024} KiB")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", default="x86_64,aarch64")
    parser.add_argument("--minors", default=",".join(MINORS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/tfdet-wheel-build"))
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    for machine in args.machines.split(","):
        build_machine(machine, args.minors.split(","), args.work, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
