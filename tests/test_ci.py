"""The smoke set (ci/smoke.txt) names tests that exist, and CI's part of it."""

from __future__ import annotations

import ast
import os
import sys

import pytest

from tests.conftest import REPO, ci_module

matrix = ci_module("matrix")


def _test_functions(module: str) -> set[str]:
    tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_smoke_line_names_a_test_that_exists():
    tests = matrix.smoke_tests()
    assert tests
    for feature, node in tests:
        module, _, function = node.partition("::")
        assert (REPO / module).is_file(), (feature, node)
        if function:
            name = function.split("[")[0]
            assert name in _test_functions(module), (feature, node)


def test_ci_runs_a_part_of_the_smoke_set_marked_in_its_third_column(tmp_path):
    everything = matrix.smoke_tests()
    part = matrix.smoke_tests(part=matrix.CI_PART)
    assert part and set(part) < set(everything)
    # The features whose code reads TensorFlow's internals most are in it.
    features = {feature for feature, _ in part}
    assert {"check (built-in model)", "patches", "exact resume"} <= features
    listed = tmp_path / "smoke.txt"
    listed.write_text("# a comment\nA\ttests/a.py::test_a\tci\nB\ttests/b.py\n\n")
    assert matrix.smoke_tests(listed) == [
        ("A", "tests/a.py::test_a"),
        ("B", "tests/b.py"),
    ]
    assert matrix.smoke_tests(listed, part="ci") == [("A", "tests/a.py::test_a")]


def test_a_part_is_never_recorded():
    # A record of a part would show the features it left out as "not run".
    with pytest.raises(SystemExit) as stopped:
        matrix.main(["--oldest", "--part", "ci"])
    assert stopped.value.code == 2


def test_build_only_makes_the_environments_and_runs_no_test(monkeypatch, tmp_path):
    # CI makes them while pytest runs; a part run later finds them made.
    built, ran = [], []
    monkeypatch.setattr(matrix, "build", lambda name, venvs: built.append(name))
    monkeypatch.setattr(matrix, "prebuild_kernels", lambda python: None)
    monkeypatch.setattr(matrix, "run", lambda *args, **kwargs: ran.append(args))
    venvs = str(tmp_path / "venvs")
    assert matrix.main(["--oldest", "--build-only", "--venvs", venvs]) == 0
    assert built == [f"{matrix.MINORS[0]}-oldest"] and ran == []


cpu_by_test = ci_module("cpu_by_test")

# Burns `seconds` of its own CPU time, then exits.
BURN = "import time\nwhile time.process_time() < {seconds}:\n    pass\n"


def test_the_cpu_a_test_starts_is_charged_to_it_and_a_neighbour_by_kind(monkeypatch):
    # pytest has set PYTEST_CURRENT_TEST for this test; the processes
    # started here inherit it. The second one's argv marks it as tfdet's
    # neighbour (its code travels in a variable: the first one's argv
    # holds no mark).
    current = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
    neighbour = f"# tfdet cpu-burning neighbour\n{BURN.format(seconds=0.6)}"
    monkeypatch.setenv("TFDET_TEST_NEIGHBOUR", neighbour)
    code = (
        f"{BURN.format(seconds=1.0)}import os, subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', os.environ['TFDET_TEST_NEIGHBOUR']])\n"
    )
    status, seconds = cpu_by_test.measure([sys.executable, "-c", code], every=0.05)
    assert status == 0
    # Each read misses at most what a process used after the previous one.
    assert seconds["by_test"][current] >= 1.4, seconds
    # At least this test's neighbour: the kinds count every process on the
    # machine, and under pytest-xdist another test's check may run its own
    # neighbour meanwhile (3.25 s of one was counted here once).
    assert seconds["by_kind"]["neighbour"] >= 0.4, seconds
    others = {kind: v for kind, v in seconds["by_kind"].items() if kind != "neighbour"}
    assert sum(others.values()) >= 0.8, seconds  # By its command's name.
    assert seconds["by_file"]["tests/test_ci.py"] == seconds["by_test"][current]
    # A machine-wide figure, at least what the two processes used.
    assert seconds["machine"]["busy"] >= 1.4
