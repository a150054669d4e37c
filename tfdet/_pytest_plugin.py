"""pytest plugin: `pytest --tfdet` and the `tfdet_reproducible` fixture.

Registered through the `pytest11` entry point `tfdet`, so it is loaded in
every pytest session of an environment where tfdet is installed. Without
`--tfdet` it changes nothing and imports neither tfdet's runtime nor
TensorFlow: this module imports only pytest and the standard library.

`--tfdet` calls `tfdet.enable()` in `pytest_load_initial_conftests`, the hook
pytest calls for installed plugins before it imports the first `conftest.py`.
A conftest that builds a model at import is then already covered. Something
that ran TensorFlow ops before that point (a `-p` plugin, another installed
plugin, the process that called `pytest.main()`) makes `enable()` too late:
the session stops with tfdet's `TooLateError` message, as a pytest usage error
(exit 4), before any test runs. Each test then starts from the same seeds
(Python, NumPy, TensorFlow, Keras), so its random numbers do not depend on
which tests ran before it.

The `tfdet_reproducible` fixture calls `tfdet.check()` in the test's own
process (the check itself imports no TensorFlow; it trains in fresh
processes) and fails the test unless every bit is identical.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # Not at run time: importing the plugin imports no tfdet.
    from tfdet import CheckReport

# Options and their ini keys ([tool.pytest.ini_options] in pyproject.toml).
# Their defaults are tfdet.enable()'s: a setting given nowhere is not passed.
_SETTINGS = {
    "seed": (
        "--tfdet-seed",
        "tfdet_seed",
        "Seed of every generator (default: tfdet.enable()'s).",
    ),
    "threads": (
        "--tfdet-threads",
        "tfdet_threads",
        "TensorFlow's intra-op thread pool (default: tfdet.enable()'s).",
    ),
    "cpu_isa": (
        "--tfdet-cpu-isa",
        "tfdet_cpu_isa",
        "Cap on oneDNN's instruction set (default: tfdet.enable()'s; 'none' "
        "leaves it uncapped).",
    ),
}
# A key on the config's stash: the state of --tfdet for this session.
_STATE_KEY = pytest.StashKey["_State"]()


@dataclasses.dataclass
class _State:
    """What `--tfdet` did in this session."""

    # The determinism variables before enable() wrote them: what the
    # fixture's `tfdet check` starts from, as it would from the shell.
    environ_before: dict[str, str | None]
    profile: Any = None  # tfdet.Profile
    warnings: list[str] = dataclasses.field(default_factory=list)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tfdet", "tfdet: bit-for-bit reproducible TensorFlow")
    group.addoption(
        "--tfdet",
        action="store_true",
        default=False,
        help="Call tfdet.enable() before conftest.py files are imported, and "
        "reseed before every test.",
    )
    for name, (flag, ini, help_text) in _SETTINGS.items():
        group.addoption(
            flag,
            dest=f"tfdet_{name}",
            default=None,
            help=f"{help_text} Ini key: {ini}.",
        )
        parser.addini(ini, f"tfdet.enable({name}=...) under --tfdet. {help_text}")


def _setting(config: pytest.Config, namespace: Any, name: str) -> str | None:
    """An option's value: the command line first, then the ini file."""
    value = getattr(namespace, f"tfdet_{name}", None)
    if value is None:
        value = config.getini(_SETTINGS[name][1]) or None
    return value


def _int_setting(name: str, text: str) -> int:
    flag, ini, _ = _SETTINGS[name]
    try:
        return int(str(text).strip())
    except ValueError:
        raise pytest.UsageError(
            f"Expected an integer for {flag} (ini key {ini}). Received: {text!r}"
        ) from None


def _settings(config: pytest.Config, namespace: Any) -> dict[str, Any]:
    """`enable()`'s keyword arguments from the options and ini keys given.

    A setting given nowhere is left out: `enable()` has the default.

    Raises:
        pytest.UsageError: a value that is not an integer where one is needed.
    """
    settings: dict[str, Any] = {}
    for name in ("seed", "threads"):
        text = _setting(config, namespace, name)
        if text is not None:
            settings[name] = _int_setting(name, text)
    cpu_isa = _setting(config, namespace, "cpu_isa")
    if cpu_isa is not None:
        settings["cpu_isa"] = None if cpu_isa.strip().lower() == "none" else cpu_isa
    return settings


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    namespace = early_config.known_args_namespace
    if not namespace.tfdet or namespace.help or namespace.version:
        return
    settings = _settings(early_config, namespace)
    import tfdet  # Only now: importing it is cheap, TensorFlow comes with enable().
    from tfdet._pin._environment import DETERMINISM_VARIABLES

    state = _State({k: os.environ.get(k) for k in DETERMINISM_VARIABLES})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state.profile = tfdet.enable(**settings)
    except tfdet.TooLateError as error:
        raise pytest.UsageError(
            f"pytest --tfdet: {error} Under pytest, tfdet.enable() runs before "
            "the first conftest.py is imported; TensorFlow ran ops before that, "
            "in a plugin loaded with -p or from an installed package, or in the "
            "process that called pytest.main(). Move that TensorFlow work into "
            "a fixture or a test."
        ) from None
    except (
        tfdet.Error,  # ProfileMismatchError: enable() ran before with other settings.
        ValueError,  # A bad seed, threads or cpu_isa.
        ImportError,  # No TensorFlow, or one too old: says what to install.
    ) as error:
        raise pytest.UsageError(f"pytest --tfdet: {error}") from None
    # Warnings are shown in the header, not as stray lines before pytest's
    # output starts; PYTHONHASHSEED's with the pytest way to set it.
    for caught_warning in caught:
        message = str(caught_warning.message)
        if message.startswith("PYTHONHASHSEED"):
            message = (
                f"PYTHONHASHSEED is not {state.profile.seed} in this process (it "
                "is only read at interpreter start), so set and dict iteration "
                "orders are not pinned; run `PYTHONHASHSEED="
                f"{state.profile.seed} pytest --tfdet` to pin them too."
            )
        state.warnings.append(message)
    early_config.stash[_STATE_KEY] = state


def pytest_configure(config: pytest.Config) -> None:
    if _STATE_KEY in config.stash:
        config.pluginmanager.register(
            _Reseeder(config.stash[_STATE_KEY]), "tfdet-reseed"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return []
    p = state.profile
    lines = [
        f"tfdet: enabled, seed={p.seed} threads={p.intra_op_threads} "
        f"cpu_isa={p.cpu_isa} onednn_opts={p.onednn_opts} keras={p.keras} "
        f"tensorflow={p.tensorflow_version} "
        f"patches={','.join(p.patches) or 'none'}"
    ]
    lines.extend(f"tfdet: warning: {message}" for message in state.warnings)
    return lines


class _Reseeder:
    """Registered under --tfdet only: reseeds before each test."""

    def __init__(self, state: _State) -> None:
        self.seed = state.profile.seed

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Tests see the same generators whatever ran before them, so a test
        # selected with -k gets the bits it gets in the whole suite.
        from tfdet._setup import _enable

        _enable._seed_everything(self.seed)


# --- The tfdet_reproducible fixture ------------------------------------------


def _target_of(build: Callable[..., Any] | str) -> str:
    """The TARGET string for `tfdet check`.

    Raises:
        TypeError: `build` is neither a TARGET string nor a module-level function.
    """
    if isinstance(build, str):
        return build
    module = sys.modules.get(getattr(build, "__module__", None) or "")
    if (
        not inspect.isfunction(build)
        or module is None
        or getattr(module, build.__name__, None) is not build
    ):
        raise TypeError(
            "Expected a function defined at module level (tfdet check imports it "
            "by name in fresh processes) or a TARGET string like "
            f"'path/to/test_file.py:build'. Received: {build!r}"
        )
    path = inspect.getsourcefile(build)
    if path is None:
        raise TypeError(f"Expected a function defined in a file. Received: {build!r}")
    return f"{os.path.abspath(path)}:{build.__name__}"


def check_or_fail(
    build: Callable[..., Any] | str,
    *,
    steps: int = 3,
    runs: int = 2,
    device: str = "cpu",
    perturb: str = "all",
    seed: int | None = None,
    threads: int | None = None,
    attribute: bool = False,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    **options: Any,
) -> CheckReport:
    """Runs `tfdet.check()` on `build` in fresh processes; fails the test unless equal.

    Args:
        build: A module-level function returning a compiled Keras model or
            `(model, x, y)`, or a TARGET string (`path/to/file.py:function`,
            `package.module:function`, `builtin:NAME`; relative to the current
            directory). A function is passed as its file's path, which the
            runs import as a script: a test module that uses relative imports
            needs the `package.module:function` form.
        steps: Training steps per run.
        runs: Processes (at least 2).
        device: "cpu" (the default here, so that a test means the same on
            every machine), "gpu" or "all".
        perturb: "all", "none" or a comma-separated list.
        seed: None: the session's `--tfdet-seed` / `tfdet_seed`, else the
            check's default (0).
        threads: None: the session's `--tfdet-threads`, else the check's
            default (every CPU each run may use).
        attribute: On divergence, re-run to name the perturbation responsible
            (more processes; off by default, `tfdet check TARGET` does it).
        timeout: Seconds per run.
        env: The environment the runs start from (default: this process's).
        **options: Any other option of `tfdet.check()` (`cpu_isa`,
            `enable`, `workers`, ...).

    Returns:
        The check's `tfdet.CheckReport`, as `tfdet.check()` returns it, when
        every bit is identical.

    Raises:
        pytest.fail.Exception: the bits differ, a run failed or timed out, or
            the check could not start. The message is `tfdet check`'s own
            report (each run, the first diverging step and quantity with both
            values, a failed run's stderr tail).
        pytest.skip.Exception: `device="gpu"` on a machine without a GPU.
    """
    from unittest import mock  # Here: every pytest session loads this module.

    import tfdet  # The check's modules; none of them imports TensorFlow.
    from tfdet._cli import _check_text

    target = _target_of(build)
    heading = f"tfdet check {target} ({runs} runs x {steps} steps)"
    given = {"seed": seed, "threads": threads}
    options.update({name: value for name, value in given.items() if value is not None})
    try:
        # In this process's directory: TARGETs relative to it resolve as
        # they would from the shell.
        # The runs start from `os.environ`: `env` replaces it meanwhile.
        environment = (
            contextlib.nullcontext()
            if env is None
            else mock.patch.dict(os.environ, env, clear=True)
        )
        with environment:
            result = tfdet.check(
                target,
                runs=runs,
                steps=steps,
                device=device,
                perturb=perturb,
                attribute=attribute,
                timeout=timeout,
                **options,
            )
    except tfdet.DeviceUnavailableError as error:
        pytest.skip(f"{heading}: {error}")
    except (tfdet.Error, ValueError, TypeError) as error:
        # A bad TARGET or option: no verdict to report.
        pytest.fail(f"{heading} could not run: {error}", pytrace=False)
    if result.verdict == "identical":
        return result
    text = _check_text.format_report(result)
    if result.verdict == "diverged":
        pytest.fail(f"{heading}: bits diverged.\n{text}", pytrace=False)
    pytest.fail(
        f"{heading}: verdict {result.verdict!r} (exit {result.exit_code}); no "
        f"comparison of bits passed.\n{text}",
        pytrace=False,
    )


@pytest.fixture
def tfdet_reproducible(request: pytest.FixtureRequest) -> Callable[..., CheckReport]:
    """`tfdet_reproducible(build, steps=3, runs=2, ...)`: `tfdet.check()` as an assertion.

    Trains `build` (a module-level function, or a TARGET string) in fresh
    processes that look like different machines and fails the test with the
    first diverging step, quantity and both values when any bit differs, or
    with the failing run's stderr when a run fails. Seed and threads default
    to the session's `--tfdet-seed` / `--tfdet-threads` (or ini keys) when
    given. See `check_or_fail` for every argument.
    """
    config = request.config
    defaults: dict[str, Any] = {}
    for name in ("seed", "threads"):
        text = _setting(config, config.option, name)
        if text is not None:
            defaults[name] = _int_setting(name, text)

    state = config.stash.get(_STATE_KEY, None)
    if state is not None:
        # Under --tfdet, enable() wrote PYTHONHASHSEED, thread counts, the ISA
        # cap... into os.environ; the runs start from the environment before
        # it, as a check from the shell would, and set themselves up.
        env = dict(os.environ)
        for key, value in state.environ_before.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        defaults["env"] = env

    def check(build: Callable[..., Any] | str, **kwargs: Any) -> CheckReport:
        return check_or_fail(build, **{**defaults, **kwargs})

    return check
