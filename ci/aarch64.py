"""An aarch64 Python with TensorFlow on an x86-64 machine, under QEMU's emulator.

Usage (with Python 3.10+, pip, Debian's or Ubuntu's apt, and `qemu-aarch64`
from `apt-get install qemu-user`):

    python3 ci/aarch64.py DIR        # builds DIR/root and DIR/venv
    DIR/venv/bin/python -c "import platform; print(platform.machine())"

An emulation, not a real ARM CPU: QEMU's user-mode emulator (TCG) runs the
aarch64 instructions of TensorFlow's aarch64 wheel one by one on this x86-64
CPU, with IEEE arithmetic as the real instructions compute it (so what
depends on the architecture shows), 20-50 times slower than native. It
imitates the CPU model named by `QEMU_CPU` (default `max`: ARMv8 with SVE).

What it builds, with no root and nothing installed system-wide:

- `DIR/root`: the distribution's arm64 Python and C/C++ runtime, unpacked
  from its own arm64 packages (`apt-get download` with a private package
  list, then `dpkg -x`), where the emulator finds the aarch64 dynamic loader
  and libraries (`qemu-aarch64 -L DIR/root`);
- `DIR/venv`: a virtual environment of that Python whose `bin/python` is a
  shell script that runs it under the emulator. The interpreter's argv[0]
  stays that script (`qemu-aarch64 -0`), so `sys.executable` names it and
  every process tfdet or a test spawns is emulated too;
- its packages, installed by this machine's pip for the aarch64 platform
  (`pip install --platform manylinux_2_17_aarch64 ... --target`): at native
  speed, from the aarch64 wheels on PyPI (TensorFlow's is `tensorflow`:
  there is no `tensorflow-cpu` for aarch64).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kernel_build

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "ci" / "constraints.txt"
EMULATOR = "qemu-aarch64"
# Debian's g++-aarch64-linux-gnu: builds tfdet's kernels for the emulated venv.
CROSS_COMPILER = "aarch64-linux-gnu-g++"
# The distribution's default Python (`python3`) and the C++ runtime that
# TensorFlow's libraries need beside what Python pulls in.
PACKAGES = ("python3", "libstdc++6", "libgomp1")
# The wheel tags of aarch64 Linux that pip may pick (glibc 2.17 and up).
PLATFORMS = tuple(f"manylinux_2_{minor}_aarch64" for minor in (17, 26, 27, 28)) + (
    "manylinux2014_aarch64",
    "linux_aarch64",
)
# What the tests need there: TensorFlow's aarch64 wheel (same version as the
# x86 suite's `tensorflow-cpu`), tf_keras without its dependencies (as for
# tensorflow-cpu), pytest and its workers.
TEST_REQUIREMENTS = ("keras", "pytest>=7", "pytest-xdist>=3", "hypothesis>=6")
WRAPPER = """#!/bin/sh
# An aarch64 Python under QEMU's user-mode emulator (ci/aarch64.py): argv[0]
# stays this file, so the interpreter finds its virtual environment and the
# processes it spawns with sys.executable are emulated too.
exec {emulator} -L {root} -0 "$0" {root}/usr/bin/{python} "$@"
"""


class Unavailable(Exception):
    """This machine cannot build the emulated aarch64 Python (says why)."""


def _apt_options(state: Path) -> list[str]:
    """apt's options for a package list of its own, for arm64 only: the
    machine's own list, configuration and installed packages are untouched."""
    return [
        f"-oDir::State={state}/state",
        f"-oDir::State::status={state}/status",
        f"-oDir::Cache={state}/cache",
        "-oAPT::Architecture=arm64",
        "-oAPT::Architectures::=arm64",
        "-oDebug::NoLocking=1",
        "-qq",
    ]


def _apt(command: list[str], cwd: Path | None = None) -> None:
    """Runs apt; a failure is `Unavailable`: the machine's sources may not
    serve arm64 (Ubuntu keeps it on ports.ubuntu.com) or be unreachable."""
    try:
        subprocess.run(command, cwd=cwd, check=True)
    except subprocess.CalledProcessError as error:
        raise Unavailable(
            f"`apt-get {command[-1] if command[-1] == 'update' else 'download'}` "
            f"for arm64 failed (exit {error.returncode}): do this machine's apt "
            "sources serve arm64?"
        ) from error


def _sysroot(root: Path, work: Path) -> str:
    """Unpacks the arm64 Python and its libraries into `root`; the name of
    its interpreter (e.g. `python3.11`)."""
    for tool in ("apt-get", "apt-cache", "dpkg"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} not found: the arm64 Python comes from apt")
    state = work / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    options = _apt_options(state)
    _apt(["apt-get", *options, "update"])
    depends = subprocess.run(
        ["apt-cache", *options, "depends", "--recurse", "--no-recommends",
         "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
         "--no-enhances", *PACKAGES],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # Package names start a line; virtual ones are in <brackets>, indented.
    names = sorted({line for line in depends.splitlines() if line[:1].isalnum()})
    debs = work / "debs"
    debs.mkdir(exist_ok=True)
    _apt(["apt-get", *options, "download", *names], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    python = (root / "usr" / "bin" / "python3").resolve()
    if not python.exists():
        raise Unavailable(f"the arm64 packages hold no {python}")
    return python.name


def _pip_aarch64(site: Path, python_version: str, *requirements: str) -> None:
    """Installs aarch64 wheels into `site` with this machine's pip."""
    platform_args = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", "--upgrade", "--target", str(site),
         "--only-binary=:all:", *platform_args, "--python-version", python_version,
         "--implementation", "cp", "-c", str(CONSTRAINTS), *requirements],
        check=True,
    )  # fmt: skip


def tensorflow_requirement() -> str:
    """`tensorflow==X`, the version of CI's `tensorflow-cpu` (ci/constraints.txt)."""
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line.startswith("tensorflow-cpu=="):
            return "tensorflow==" + line.split("==", 1)[1].strip()
    raise RuntimeError(f"no tensorflow-cpu pin in {CONSTRAINTS}")


def build(directory: Path) -> Path:
    """Builds (or rebuilds) the emulated Python in `directory`; its venv's python.

    Raises:
        Unavailable: no emulator, or no apt to fetch the arm64 Python with.
    """
    emulator = shutil.which(EMULATOR)
    if emulator is None:
        raise Unavailable(f"{EMULATOR} not found (apt-get install qemu-user)")
    directory = directory.resolve()
    root, venv = directory / "root", directory / "venv"
    for old in (root, venv):
        shutil.rmtree(old, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    interpreter = _sysroot(root, directory)
    subprocess.run(
        [emulator, "-L", str(root), str(root / "usr" / "bin" / interpreter),
         "-m", "venv", "--without-pip", str(venv)],
        check=True,
    )  # fmt: skip
    bin_dir = venv / "bin"
    for link in bin_dir.glob("python*"):
        link.unlink()
    python = bin_dir / "python"
    python.write_text(WRAPPER.format(emulator=emulator, root=root, python=interpreter))
    python.chmod(0o755)
    (bin_dir / "python3").symlink_to("python")
    version = interpreter.removeprefix("python")
    site = venv / "lib" / interpreter / "site-packages"
    _pip_aarch64(site, version, tensorflow_requirement(), *TEST_REQUIREMENTS)
    # tf_keras declares a dependency on `tensorflow` (installed above): none
    # other, so without its dependencies.
    _pip_aarch64(site, version, "--no-deps", "tf_keras")
    return python


def install_checkout(python: Path) -> None:
    """Installs this checkout's tfdet into the emulated venv, as a wheel built
    here: with the kernels compiled by the cross compiler
    (aarch64-linux-gnu-g++) against the venv's own aarch64 TensorFlow, as a
    source install on an ARM machine would build them; without kernels
    where there is no cross compiler."""
    site = next((python.parent.parent / "lib").glob("python3.*/site-packages"))
    version = site.parent.name.removeprefix("python")
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "TFDET_BUILD_KERNELS": "0"}
        cross = shutil.which(CROSS_COMPILER)
        if cross is not None:
            directory = kernel_build.load().build_shipped(
                cross, site, "install", Path(scratch) / "lib", "aarch64"
            )
            print(f"ci/aarch64.py: kernels cross-compiled into {directory.name}")
            env = {
                **os.environ,
                "TFDET_SHIPPED_KERNELS": str(directory.parent),
                "TFDET_WHEEL_PLATFORM": "manylinux_2_27_aarch64",
            }
        wheels = Path(scratch) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--wheel-dir", str(wheels), str(REPO)],
            env=env, check=True,
        )  # fmt: skip
        (wheel,) = wheels.glob("tfdet-*.whl")
        _pip_aarch64(site, version, "--no-deps", str(wheel))


def describe() -> str:
    """The emulated machine in words, for a record: emulator, version, CPU."""
    emulator = shutil.which(EMULATOR) or EMULATOR
    version = subprocess.run(
        [emulator, "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n", 1)[0]
    cpu = os.environ.get("QEMU_CPU", "max")
    return f"emulated aarch64 ({version.strip()}, CPU {cpu})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="Where to build it.")
    args = parser.parse_args(argv)
    try:
        python = build(args.directory)
    except Unavailable as reason:
        print(f"ci/aarch64.py: cannot build here: {reason}", file=sys.stderr)
        return 1
    install_checkout(python)
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
