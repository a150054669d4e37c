"""The package surface: what `import tfdet` exposes, and that it changes nothing."""

from __future__ import annotations

import ast
import graphlib
import importlib.metadata

import pytest

import tfdet
from tests.conftest import REPO, clean_env, last_json_line, run_python
from tfdet._cli import main

LAZY = {"DeterminismCallback"}  # Subclasses a Keras class: loaded on first use.


def test_dir_is_all() -> None:
    assert set(dir(tfdet)) == set(tfdet.__all__)


def test_public_names_are_pinned() -> None:
    # Adding a public name is a decision; removing one breaks users.
    assert sorted(tfdet.__all__) == [
        "CheckReport",
        "DeterminismCallback",
        "DeviceUnavailableError",
        "DivergenceError",
        "Error",
        "ExitCode",
        "NondeterministicError",
        "Profile",
        "ProfileMismatchError",
        "ResumeError",
        "RunFailedError",
        "TargetError",
        "TooLateError",
        "TraceFormatError",
        "__version__",
        "check",
        "coverage",
        "enable",
        "is_enabled",
        "profile",
        "random_state",
    ]


def test_every_public_name_resolves() -> None:
    for name in sorted(set(tfdet.__all__) - LAZY):
        assert getattr(tfdet, name) is not None, name


def test_callback_is_loaded_on_first_use_only() -> None:
    # The callback subclasses a Keras class, so importing it imports
    # TensorFlow: `import tfdet` must not, the first attribute access must.
    result = run_python(
        """
        import json, sys
        import tfdet
        before = "tfdet._record._callback" in sys.modules or "keras" in sys.modules
        callback = tfdet.DeterminismCallback
        print(json.dumps({
            "loaded_by_import": before,
            "name": callback.__name__,
            "module": callback.__module__,
            "is_the_module_class": callback is sys.modules["tfdet._record._callback"].DeterminismCallback,
            "is_a_class": isinstance(callback, type),
        }))
        """,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_json_line(result.stdout) == {
        "loaded_by_import": False,
        "name": "DeterminismCallback",
        "module": "tfdet._record._callback",
        "is_the_module_class": True,
        "is_a_class": True,
    }


def test_hypothesis_writes_nothing_into_the_repository() -> None:
    # conftest: property tests must leave no `.hypothesis/` behind.
    from hypothesis import settings
    from hypothesis.configuration import storage_directory

    assert settings().database is None
    cache = storage_directory("constants", intent_to_write=False).path.resolve()
    assert REPO.resolve() not in cache.parents


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfdet.nope  # noqa: B018


def test_version_matches_the_installed_distribution() -> None:
    assert tfdet.__version__ == importlib.metadata.version("tfdet")


def test_import_does_not_import_tensorflow_or_change_the_environment() -> None:
    # `tfdet run` and enable() must still be able to set what TensorFlow reads
    # at import, so neither importing tfdet nor building the CLI may start it.
    result = run_python(
        """
        import json, os, sys
        before = dict(os.environ)
        import tfdet
        import tfdet._cli.run, tfdet._cli.env, tfdet._setup._launch
        # The Python API of the check spawns the runs: it needs no TensorFlow.
        tfdet.check, tfdet.CheckReport
        print(json.dumps({
            "tensorflow": "tensorflow" in sys.modules,
            "keras": "keras" in sys.modules or "tf_keras" in sys.modules,
            "env_changed": dict(os.environ) != before,
            "enabled": tfdet.is_enabled(),
            "profile": tfdet.profile(),
        }))
        """,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert last_json_line(result.stdout) == {
        "tensorflow": False,
        "keras": False,
        "env_changed": False,
        "enabled": False,
        "profile": None,
    }


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tfdet", "--help"]) == 0
    out = capsys.readouterr().out
    assert "run" in out and "env" in out and "Exit codes" in out


def _imports_between_tfdet_modules() -> dict[str, set[str]]:
    """Each tfdet module's imports of other tfdet modules, deferred ones too.

    An import inside a function counts: it still ties the two modules
    together. The import of a module's parent package, which Python makes
    implicitly, does not.
    """
    paths = {}
    for path in (REPO / "tfdet").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    imported.add(submodule if submodule in paths else node.module)
        graph[name] = {other for other in imported & paths.keys() if other != name}
    return graph


def test_no_import_cycle_between_tfdet_modules() -> None:
    graph = _imports_between_tfdet_modules()
    assert "tfdet._setup._enable" in graph["tfdet"]  # The walk sees imports.
    # CycleError names the modules of the cycle.
    graphlib.TopologicalSorter(graph).prepare()


# The packages, from the command line down: each may import only packages of
# a lower layer; packages side by side import neither each other nor
# themselves across (`_record` and the TARGET; the runner and the child; the
# protocol and `_graph`; `_pin` and `_resume`). The entry points (`tfdet`, its `__main__`, the
# pytest plugin) sit on top; `_errors`, `_cpuinfo`, `_notices`, `_user_cache` and
# `_version` at the bottom.
LAYERS = {
    "tfdet._pytest_plugin": 12,  # Calls the public API.
    "tfdet": 11,
    "tfdet.__main__": 11,
    "tfdet._cli": 10,
    "tfdet._cost": 9,  # Starts its runs with the runner, in child processes.
    "tfdet._commands": 8,  # check, check --script, locate, the Python API.
    "tfdet._runner": 7,  # The parent's side of a child process.
    "tfdet._child": 7,  # What runs inside one.
    "tfdet._record": 6,  # Traces; comparing runs reads the predictions' format.
    "tfdet._target": 6,
    "tfdet._protocol": 5,  # What both sides agree on: spec, perturbations.
    "tfdet._graph": 5,
    "tfdet._setup": 4,
    "tfdet.patches": 3,
    "tfdet._patching": 2,  # The registry, the hazard table, the swaps.
    "tfdet._pin": 1,
    "tfdet._kernels": 1,  # tfdet's C++ ops: sources, shipped libraries, loading.
    "tfdet._resume": 1,  # Exact resume, installed by a patch.
    "tfdet._errors": 0,
    "tfdet._cpuinfo": 0,  # /proc/cpuinfo's flags, for the pins and the kernels.
    "tfdet._variables": 0,
    "tfdet._user_cache": 0,  # ~/.cache/tfdet: kernels, library symbols.
    "tfdet._notices": 0,
    "tfdet._version": 0,
}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_packages_import_only_the_layers_below_them() -> None:
    graph = _imports_between_tfdet_modules()
    assert {_package(module) for module in graph} == set(LAYERS)
    upward = sorted(
        f"{module} -> {other}"
        for module, imported in graph.items()
        for other in imported
        if _package(module) != _package(other)
        and LAYERS[_package(other)] >= LAYERS[_package(module)]
    )
    assert upward == []


# The parent's side: the commands and the runner that starts the children
# (and the CLI and cost tools above them).
PARENT_SIDE = {"tfdet._commands", "tfdet._runner", "tfdet._cli", "tfdet._cost"}


def test_the_child_side_never_imports_the_parent_side() -> None:
    """A child may share the protocol and the TARGET loading, but must not
    depend on how it was started."""
    graph = _imports_between_tfdet_modules()
    child = [module for module in graph if _package(module) == "tfdet._child"]
    assert "tfdet._child._start" in child and "tfdet._child._worker" in child
    child_to_parent = sorted(
        f"{module} -> {other}"
        for module in child
        for other in graph[module]
        if _package(other) in PARENT_SIDE
    )
    assert child_to_parent == []


@pytest.mark.parametrize(
    ("keras", "legacy", "refused"),
    [("3.0.0", "0", True), ("3.4.1", "0", True), ("3.5.0", "0", False),
     ("3.15.1", "0", False)],
)  # fmt: skip
def test_a_keras_3_older_than_the_floor_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, keras: str, legacy: str, refused: bool
) -> None:
    # The version matrix (ci/matrix.py) found Keras 3.0 breaking enable(),
    # resume and the patches.
    from tfdet._pin import _versions

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
    monkeypatch.setattr(
        _versions,
        "distribution_version",
        lambda name: keras if name == "keras" else None,
    )
    if refused:
        with pytest.raises(ImportError, match=r"Keras >= 3\.5.*keras==" + keras):
            _versions.check_keras_version()
    else:
        _versions.check_keras_version()


@pytest.mark.parametrize("tf_keras", ["2.21.0", None])
def test_legacy_keras_needs_tf_keras_not_keras_3(
    monkeypatch: pytest.MonkeyPatch, tf_keras: str | None
) -> None:
    # With TF_USE_LEGACY_KERAS the Keras 3 version does not matter, but a
    # missing tf_keras is said with the command that installs it.
    from tfdet._pin import _versions

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    versions = {"keras": "3.0.0", "tf_keras": tf_keras, "tensorflow-cpu": "2.18.1"}
    monkeypatch.setattr(_versions, "distribution_version", versions.get)
    if tf_keras is None:
        with pytest.raises(ImportError, match=r"--no-deps 'tf_keras==2\.18\.\*'"):
            _versions.check_keras_version()
    else:
        _versions.check_keras_version()
