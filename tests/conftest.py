"""Shared fixtures: fresh-process runners with controlled environments.

Reproducibility is a property of fresh processes, and TensorFlow's global state
(thread pools, op determinism, seeds) cannot be undone inside one, so tests
that touch it spawn `sys.executable` here instead of mutating the test process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir
from packaging.version import Version

from tfdet._commands._options import RunOptions
from tfdet._pin import _versions
from tfdet._pin._environment import DETERMINISM_VARIABLES
from tfdet._runner._process import child_environment

REPO = Path(__file__).resolve().parents[1]


def ci_module(name: str) -> Any:
    """`ci/<name>.py`, loaded by path (ci/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The running TensorFlow's (major, minor), read without importing it.
TENSORFLOW_RELEASE = Version(_versions.tensorflow_distribution()[1]).release[:2]
# TensorFlow's own Erfc (and with it the exact GELU) follows the CPU model
# from this release: its Eigen's generic_fast_erfc<float> takes RCPPS. Up to
# 2.19 the bits were the same natively and on QEMU's emulated Haswell-v4, so
# enable() installs portable_erfc from here (tests/test_emulation.py).
ERFC_FOLLOWS_THE_CPU_FROM = (2, 20)
ERFC_FOLLOWS_THE_CPU = TENSORFLOW_RELEASE >= ERFC_FOLLOWS_THE_CPU_FROM
# `--patches` for the controls: the default less tfdet's products and
# convolutions (kernels and compositions), so TensorFlow's own compute them,
# as under the default before 2026-12-07.
TENSORFLOW_PRODUCTS = ",".join(
    [
        "auto",
        "-pool_size_free_products",
        "-fixed_order_products",
        "-fixed_order_convolutions",
        "-portable_kernels",
    ]
)

# Where ci/test.sh installs matplotlib: outside the virtual environment, so
# that only pytest's own process (where the --plot tests draw) can import it,
# and not the TensorFlow processes the tests spawn, which would pay about 1 s
# each for Keras's import of matplotlib.pyplot. A spawned process that needs
# it puts these paths on its PYTHONPATH (none where matplotlib is in the venv).
_PLOT_ONLY = Path(sys.prefix) / "plot-only"
PLOT_PACKAGE_PATHS = [str(_PLOT_ONLY)] if _PLOT_ONLY.is_dir() else []
sys.path.extend(PLOT_PACKAGE_PATHS)


def check_options(**fields: Any) -> RunOptions:
    """The options of `tfdet check builtin:cnn`, with `fields` changed.

    What the perturbation tests plan from: the planner takes a check's
    options, as the commands give them, and nothing else.
    """
    return RunOptions(target="builtin:cnn", **fields)


# No example database, and Hypothesis's other caches (e.g. `constants/`) in
# the temp directory: tests leave no `.hypothesis/` directory in the repo.
settings.register_profile("tfdet", database=None)
settings.load_profile("tfdet")
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "tfdet-hypothesis")

# tfdet's fixed-order product kernel is built once for the whole suite (its
# cache is keyed by TensorFlow version and source): every pytest-xdist
# worker, and every process a test starts, finds it here rather than
# building it again into the user's cache.
os.environ.setdefault(
    "TFDET_KERNEL_CACHE",
    str(Path(tempfile.gettempdir()) / f"tfdet-test-kernels-{os.getuid()}"),
)


def _gpu_listed() -> bool:
    """Whether nvidia-smi lists a GPU (without importing TensorFlow here)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


# --- The fast loop: `pytest --no-processes` ------------------------------------
#
# A test that starts a Python process (tfdet's CLI, a fresh interpreter, a
# check's runs) takes seconds; the others take milliseconds. With
# `--no-processes`, every test is skipped at the moment it would start a
# Python process (in the test, a fixture or a thread of either), so no list
# of such tests is kept anywhere that could drift from what they do.
FAST_LOOP = "--no-processes"
_SKIPPED = f"starts a Python process ({FAST_LOOP})"
_REFUSED = pytest.StashKey[bool]()
_REFUSED_IN_MODULES = pytest.StashKey[set]()


# Runs every case of tests/test_world.py, not only CI's (marked `world`).
WORLD = "--world"


def pytest_addoption(parser) -> None:
    parser.addoption(
        FAST_LOOP,
        action="store_true",
        help="The fast loop: skip each test when it would start a Python process.",
    )
    parser.addoption(
        WORLD,
        action="store_true",
        help="Run every published program of tests/world/, not only CI's cases.",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under `--no-processes`, each test (its fixtures included) runs with
    a `subprocess.Popen` that skips it instead of starting Python. Only
    around tests: pytest-xdist starts its own workers with Python."""
    if not item.config.getoption(FAST_LOOP):
        yield
        return
    start = subprocess.Popen.__init__

    def start_unless_python(self, args, *rest, **kwargs):
        program = args[0] if isinstance(args, list | tuple) else str(args).split()[0]
        if os.path.basename(str(program)).startswith(("python", "qemu")):
            # Skipped at once in the test's thread; from another thread (a
            # check's runs) the test fails later, and the report below
            # turns that into the same skip.
            item.stash[_REFUSED] = True
            item.config.stash.setdefault(_REFUSED_IN_MODULES, set()).add(item.module)
            pytest.skip(_SKIPPED)
        start(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = start_unless_python
    try:
        yield
    finally:
        subprocess.Popen.__init__ = start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed after a refused process start is skipped instead;
    so is one whose setup failed in a module where a start was refused (a
    module-scoped fixture keeps its first failure for every later test)."""
    outcome = yield
    report = outcome.get_result()
    refused_here = item.module in item.config.stash.get(_REFUSED_IN_MODULES, set())
    if report.failed and (
        item.stash.get(_REFUSED, False) or (call.when == "setup" and refused_here)
    ):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1], f"Skipped: {_SKIPPED}")


def _shares_a_module_fixture(item) -> bool:
    """Whether `item` uses a fixture of wider scope defined in its own module."""
    module = getattr(item, "module", None)
    if module is None:
        return False
    return any(
        definition.scope != "function"
        and getattr(definition.func, "__module__", None) == module.__name__
        for definitions in item._fixtureinfo.name2fixturedefs.values()
        for definition in definitions
    )


def pytest_collection_modifyitems(config, items) -> None:
    """Skips the tests marked `gpu` on a machine without an NVIDIA GPU, those
    marked `world` without `--world`, and those marked `tf_keras` where
    tf_keras is not installed (the oldest
    combination of the version matrix has none).

    Puts the tests that share one of their module's module-scoped fixtures
    into one pytest-xdist group (used by `--dist loadgroup`, as ci/test.sh
    runs): split over two workers, each worker computed the fixture again,
    and those fixtures start the suite's costliest processes (the same check,
    the same uninterrupted training, 50 CPU-seconds each)."""
    for item in items:
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if gpu_tests and not _gpu_listed():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi lists none)")
        for item in gpu_tests:
            item.add_marker(skip)
    if not config.getoption(WORLD):
        skip = pytest.mark.skip(reason=f"one of tests/world/'s cases that {WORLD} runs")
        for item in items:
            if "world" in item.keywords:
                item.add_marker(skip)
    if importlib.util.find_spec("tf_keras") is None:
        skip = pytest.mark.skip(reason="tf_keras is not installed")
        for item in items:
            if "tf_keras" in item.keywords:
                item.add_marker(skip)


def clean_env(**overrides: str | None) -> dict[str, str]:
    """os.environ without determinism variables, plus `overrides` (None unsets)."""
    env = {k: v for k, v in os.environ.items() if k not in DETERMINISM_VARIABLES}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    return child_environment(env, overrides)


def run_python(
    code: str,
    *,
    env: dict[str, str] | None = None,
    cpus: Sequence[int] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; `cpus` restricts its CPU affinity."""
    preexec = None
    if cpus is not None:
        cpu_set = set(cpus)

        def preexec() -> None:
            os.sched_setaffinity(0, cpu_set)

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,
        check=False,
    )


def run_tfdet(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd=None
) -> subprocess.CompletedProcess:
    """Runs the `tfdet` CLI in a fresh process (`python -m tfdet ...`)."""
    return subprocess.run(
        [sys.executable, "-m", "tfdet", *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def run_checks_side_by_side(
    args: list[str], variants: dict[str, list[str]], reports: Path, timeout: float = 900
) -> tuple[dict[str, str], dict[str, int], dict[str, dict]]:
    """Runs `tfdet check ARGS --json REPORTS/NAME FLAGS` per variant, at once.

    Returns:
        Each variant's output (stdout and stderr), exit code and JSON report
        (empty when it wrote none).
    """
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "tfdet", "check", *args, "--json",
             str(reports / name), *flags],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, flags in variants.items()
    }  # fmt: skip
    outputs = {name: p.communicate(timeout=timeout)[0] for name, p in processes.items()}
    codes = {name: p.returncode for name, p in processes.items()}
    found = {
        name: json.loads((reports / name).read_text())
        if (reports / name).exists()
        else {}
        for name in variants
    }
    return outputs, codes, found


def tree_digest(root: Path) -> dict[str, str]:
    """Every regular file under `root` (links not followed): its SHA-256."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def last_json_line(stdout: str) -> dict:
    """The last line of `stdout` that parses as a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{stdout}")


def run_json(code: str, *arguments: str, **env: str) -> dict:
    """`code` with `sys.argv[1:] = arguments` in a fresh process (`env` added
    to its clean environment), which must succeed; its last JSON line."""
    argv = f"import sys; sys.argv = ['run', *{list(arguments)!r}]\n"
    result = run_python(argv + code, env=clean_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json_line(result.stdout)


@pytest.fixture
def two_cpus() -> tuple[int, int]:
    """Two CPUs this process may use, or skip (affinity tests need two)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        pytest.skip("CPU affinity is not available on this platform")
    if len(cpus) < 2:
        pytest.skip("affinity perturbation needs at least 2 CPUs")
    return cpus[0], cpus[1]
