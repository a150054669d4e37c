"""The smoke set (ci/smoke.txt) names tests that exist, and CI's part of it."""

from __future__ import annotations

import ast
import importlib.util

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("matrix", REPO / "ci" / "matrix.py")
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)


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
