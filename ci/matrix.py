"""Run tfdet's smoke set on every TensorFlow and Keras that tfdet accepts.

Usage (from anywhere, with Python 3.10+ and pip; stdlib only):

    python3 ci/matrix.py                      # every combination
    python3 ci/matrix.py 2.16-oldest          # some, by name
    python3 ci/matrix.py --list               # the names
    python3 ci/matrix.py --oldest --part ci --no-record   # what CI runs
    python3 ci/matrix.py --oldest --build-only  # its environment and kernels

For each TensorFlow minor release tfdet supports there are two combinations,
each in a virtual environment of its own (`.venv-matrix/<name>`, reused when
its requirements are unchanged):

- `<minor>-newest`: `tensorflow-cpu==<minor>.*` with the Keras 3 that pip
  resolves for it, and tf_keras of the same minor (installed without its
  dependencies, as the docs tell users of tensorflow-cpu);
- `<minor>-oldest`: the same TensorFlow with the oldest Keras 3 that both
  its wheel (`Requires-Dist`) and tfdet (`MIN_KERAS`) accept;

and one more, `<newest minor>-aarch64-emulated` (`--aarch64`): TensorFlow's
aarch64 wheel of CI's version in an aarch64 Python that QEMU's user-mode
emulator runs on this x86-64 machine (`ci/aarch64.py`). An emulation of an
ARM CPU, not one; about 20-50 times slower than native, so CI runs only its
part of the smoke set (the lines marked `aarch64`).

In each, tfdet is installed from this checkout (`pip install -e ".[test]"`)
and pytest runs the tests listed in `ci/smoke.txt`. The outcome of every
test, the versions and the machine go to `docs/reference/compatibility.json`
(merged by combination name); `python docs/generate.py` renders
`docs/reference/compatibility.md` from it. Exit status: 0 when every test of
every combination run passed or skipped, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# ci/aarch64.py, beside this file (also when tests load this one by path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import aarch64  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "ci" / "smoke.txt"
RESULTS = REPO / "docs" / "reference" / "compatibility.json"
# The TensorFlow minor releases tfdet supports, oldest first.
MINORS = ("2.16", "2.17", "2.18", "2.19", "2.20", "2.21")
KINDS = ("newest", "oldest")
# The emulated aarch64 combination (ci/aarch64.py): CI's TensorFlow version.
AARCH64 = f"{MINORS[-1]}-aarch64-emulated"


def combinations() -> list[str]:
    """Every combination's name, oldest TensorFlow first, aarch64 last."""
    return [f"{minor}-{kind}" for minor in MINORS for kind in KINDS] + [AARCH64]


# The marks of the smoke lines CI runs, in the list's third column and after:
# `ci` on the oldest x86-64 combination, `aarch64` on the emulated aarch64 one.
CI_PART = "ci"
AARCH64_PART = "aarch64"


def smoke_tests(path: Path = SMOKE, part: str | None = None) -> list[tuple[str, str]]:
    """`(feature, pytest node id)` for each line of the smoke list, or only
    for the lines marked `part` (`CI_PART`) when it is given."""
    tests = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        feature, node, *marks = line.split("\t")
        if part is None or part in (mark.strip() for mark in marks):
            tests.append((feature.strip(), node.strip()))
    return tests


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         *args],
        check=True,
    )  # fmt: skip


def _oldest_keras(python: Path) -> str:
    """The lowest Keras that both the installed tensorflow-cpu and tfdet accept."""
    code = (
        "import importlib.metadata as m; from tfdet._pin import _versions; "
        "print(_versions.MIN_KERAS); "
        "print('\\n'.join(m.requires('tensorflow-cpu') or []))"
    )
    tfdet_floor, *requires = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for requirement in requires:
        found = re.match(r"keras\s*>=\s*([\d.]+)", requirement.split(";")[0].strip())
        if found:
            floors = (found.group(1), tfdet_floor)
            return max(floors, key=lambda v: tuple(int(p) for p in v.split(".")))
    raise RuntimeError(f"no 'keras>=' requirement in tensorflow-cpu: {requires}")


def _recipe(name: str) -> str:
    """What makes a combination's environment: reused while it is the same
    (its name and the text of the files that build it)."""
    makers = [Path(__file__)]
    if name == AARCH64:
        makers += [Path(aarch64.__file__), aarch64.CONSTRAINTS]
    return "\n".join([name, *(path.read_text(encoding="utf-8") for path in makers)])


def build_aarch64(venvs: Path) -> Path:
    """The emulated aarch64 combination's Python, made or reused, with this
    checkout installed (a copy: its pip is this machine's, for aarch64)."""
    directory = venvs / AARCH64
    python = directory / "venv" / "bin" / "python"
    marker = directory / "tfdet-matrix-recipe"
    if not (
        python.exists() and marker.exists() and marker.read_text() == _recipe(AARCH64)
    ):
        python = aarch64.build(directory)
        marker.write_text(_recipe(AARCH64))
    aarch64.install_checkout(python)
    return python


def build(name: str, venvs: Path) -> Path:
    """The combination's virtual environment, made or reused; its python."""
    if name == AARCH64:
        return build_aarch64(venvs)
    minor, kind = name.split("-")
    venv = venvs / name
    python = venv / "bin" / "python"
    # Reused when made by the same recipe (this file's text and the name).
    recipe = _recipe(name)
    marker = venv / "tfdet-matrix-recipe"
    if python.exists() and marker.exists() and marker.read_text() == recipe:
        _pip(python, "--no-deps", "-e", str(REPO))  # This checkout, again.
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    _pip(python, f"tensorflow-cpu=={minor}.*")
    _pip(python, "-e", f"{REPO}[test]")
    if kind == "oldest":
        _pip(python, f"keras=={_oldest_keras(python)}")
    else:
        _pip(python, "--no-deps", f"tf_keras=={minor}.*")
    marker.write_text(recipe)
    return python


def prebuild_kernels(python: Path) -> None:
    """Builds tfdet's kernels for `python`'s TensorFlow ahead of its tests
    (`ci/prebuild_kernels.py`); a failure is said there and left to the tests."""
    subprocess.run([str(python), str(REPO / "ci" / "prebuild_kernels.py")], check=False)


def versions(python: Path) -> dict[str, str | None]:
    code = """
import importlib.metadata as m, json
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
names = ("tensorflow-cpu", "tensorflow", "keras", "tf_keras", "numpy")
print(json.dumps({n: v(n) for n in names}))
"""
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


def _outcomes(junit: Path) -> dict[str, str]:
    """`{node id: "passed" | "failed" | "skipped"}` from a JUnit XML report."""
    outcomes = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        node = f"{module}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[node] = "failed"
        elif case.find("skipped") is not None:
            outcomes[node] = "skipped"
        else:
            outcomes[node] = "passed"
    return outcomes


def _selected(node: str, listed: str) -> bool:
    """Whether test `node` is one that the smoke line `listed` selects."""
    if "::" not in listed:  # A whole module.
        return node.startswith(listed + "::")
    return node == listed or node.startswith(listed + "[")


def run(name: str, venvs: Path, jobs: int, part: str | None = None) -> dict:
    """Builds the combination and runs the smoke set (or its `part`); its record."""
    started = time.monotonic()
    python = build(name, venvs)
    installed = time.monotonic()
    if name == AARCH64:
        part = AARCH64_PART  # The whole set would take hours there.
    tests = smoke_tests(part=part)
    nodes = list(dict.fromkeys(node for _, node in tests))
    junit = venvs / f"{name}.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-n", str(jobs), "--junitxml", str(junit), *nodes],
        cwd=REPO, env=env, check=False,
    )  # fmt: skip
    outcomes = _outcomes(junit) if junit.exists() else {}
    features: dict[str, str] = {}
    for feature, listed in tests:
        found = [o for node, o in outcomes.items() if _selected(node, listed)]
        if not found:
            outcome = "not run"
        elif "failed" in found:
            outcome = "failed"
        elif all(o == "skipped" for o in found):
            outcome = "skipped"
        else:
            outcome = "passed"
        previous = features.get(feature, "passed")
        order = ("failed", "not run", "skipped", "passed")
        features[feature] = min(previous, outcome, key=order.index)
    return {
        "date": datetime.date.today().isoformat(),
        "versions": versions(python),
        "pytest_exit": result.returncode,
        "install_seconds": round(installed - started),
        "test_seconds": round(time.monotonic() - installed),
        "features": features,
        "failed_tests": sorted(n for n, o in outcomes.items() if o == "failed"),
    }


def machine() -> str:
    """The CPU (model name, family and model: the microarchitecture, and its
    best vector width), the core count and Python, as the records name the
    machine: a virtual machine often names its CPU "AMD EPYC" alone, and
    which kernels oneDNN picks follows the microarchitecture."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        vector = "AVX-512" if "avx512f" in fields.get("flags", "").split() else "AVX2"
        model += f" (family {fields['cpu family']} model {fields['model']}, {vector})"
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="Combinations (default: all).")
    parser.add_argument("--list", action="store_true", help="Print the names.")
    parser.add_argument(
        "--oldest",
        action="store_true",
        help="Run the oldest combination (what CI runs beside the suite).",
    )
    parser.add_argument(
        "--aarch64",
        action="store_true",
        help=f"Run the emulated aarch64 combination ({AARCH64}).",
    )
    parser.add_argument(
        "--venvs",
        type=Path,
        default=Path(os.environ.get("TFDET_MATRIX_VENVS", REPO / ".venv-matrix")),
        help="Where the virtual environments live (default .venv-matrix).",
    )
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers.")
    parser.add_argument(
        "--part",
        choices=[CI_PART, AARCH64_PART],
        help="Run only the smoke lines marked so (ci: CI's part of the smoke "
        "set on x86-64; aarch64: its part on the emulated aarch64).",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="Make (or reuse) the combinations' environments and build tfdet's "
        "kernels there; run no test (CI does this while pytest runs).",
    )
    parser.add_argument(
        "--no-record",
        action="store_true",
        help=f"Do not write {RESULTS.relative_to(REPO)}.",
    )
    args = parser.parse_args(argv)
    if args.part is not None and not args.no_record:
        # A record of a part would show the features it left out as "not run".
        parser.error("--part needs --no-record")
    if args.list:
        print("\n".join(combinations()))
        return 0
    unknown = sorted(set(args.names) - set(combinations()))
    if unknown:
        parser.error(f"unknown combinations {unknown}; see --list")
    names = args.names or combinations()
    if args.oldest:
        names = [f"{MINORS[0]}-oldest"]
    if args.aarch64:
        names = [AARCH64]
    args.venvs.mkdir(parents=True, exist_ok=True)
    records = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    records.setdefault("combinations", {})
    failed = False
    for name in names:
        print(f"== {name}", flush=True)
        if args.build_only:
            started = time.monotonic()
            try:
                python = build(name, args.venvs)
            except aarch64.Unavailable as reason:
                print(f"== {name}: not built, {reason}", flush=True)
                continue
            if name != AARCH64:  # Its part builds no kernel.
                prebuild_kernels(python)
            print(f"== {name}: built in {time.monotonic() - started:.0f} s", flush=True)
            continue
        try:
            record = run(name, args.venvs, args.jobs, args.part)
        except aarch64.Unavailable as reason:
            # No emulator or no apt here: said, and not a failure of tfdet.
            print(f"== {name}: skipped, {reason}", flush=True)
            continue
        record["machine"] = machine()
        if name == AARCH64:
            record["machine"] = f"{aarch64.describe()} on {record['machine']}"
        failed |= record["pytest_exit"] != 0
        print(json.dumps(record, indent=1), flush=True)
        if not args.no_record:
            records["combinations"][name] = record
            RESULTS.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
