"""`tfdet.check()`: the check from Python, with the CLI's verdicts and exit codes.

`tfdet check` (the CLI) and `tfdet.check()` run the same code
(`check_with_options`): the same runs, the same report, the same exit code.

A TARGET may also be a callable (a function that builds the model). One
that the fresh processes can import (a module-level function of an
importable module) is passed by name, or by its file for a top-level module
(one found through a `sys.path` entry added at run time, as notebooks do,
imports there too). One that they cannot (defined in a
notebook cell, `python -c` or a script's `__main__`, or nested in another
function) is passed by value: its compiled code (`marshal`, which the runs
read back with the same `sys.executable`) goes into a temporary module with
the globals it reads, each re-created in the run:

- a module (`np`, `keras`): imported there by name;
- another function of `__main__` (a helper): passed by value the same way;
- any other value: pickled with the standard library.

A global that cannot be pickled (an open file, a model) and a closure (a
function defined inside another that reads its variables) are refused
with a `TargetError` saying what to do: build such things inside the
function. Marshal, not `inspect.getsource`: `python -c` keeps no source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import marshal
import os
import pickle
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from typing import Any

from tfdet._commands import _check
from tfdet._commands._check_report import CheckReport, RunFacts  # noqa: F401 - re-exported
from tfdet._commands._options import RunOptions
from tfdet._commands._progress_lines import ProgressFn, StepFn
from tfdet._commands._report_common import control_of
from tfdet._errors import TargetError
from tfdet._protocol import _perturb

# The file-level name of the callable in the module written for it.
_ENTRY = "tfdet_target"


def check_with_options(
    options: RunOptions,
    progress: ProgressFn | None = None,
    on_step: StepFn | None = None,
) -> CheckReport:
    """Runs the check `options` describe; what the CLI and `check()` call.

    `progress` and `on_step` as in `tfdet._commands._check.check`. With
    `options.control`, the same runs follow without tfdet, and the report
    says what they found (`CheckReport.control`).
    """
    report = _check.check(options, progress, on_step)
    if not options.control:
        return report
    if progress is not None:
        progress("control: the same runs and perturbations without tfdet")
    plain = _check.check(options.without_tfdet(), progress, on_step)
    return dataclasses.replace(report, control=control_of(plain))


def _option_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(RunOptions) if f.name != "target"]


def check(
    target: str | Callable[[], Any] | None = None,
    *,
    progress: ProgressFn | None = None,
    **options: Any,
) -> CheckReport:
    """Trains `target` in fresh processes that imitate other machines; compares bits.

    What `tfdet check` does, from Python (a notebook, a test): the same runs,
    verdict and exit code. Options and their defaults are those of
    `tfdet check` (`runs`, `steps`, `device`, `perturb`, `enable`, `seed`,
    `threads`, `cpu_isa`, `timeout`, `attribute`, `control`, `traces`,
    `workers`, `replicas`; see the signature).

    Example:

    >>> def build():                                           # doctest: +SKIP
    ...     import keras
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ...     model.compile(optimizer="adam", loss="mse")
    ...     return model
    >>> report = tfdet.check(build, steps=5)                   # doctest: +SKIP
    >>> report.verdict, report.exit_code                       # doctest: +SKIP
    ('identical', 0)

    Args:
        target: A TARGET string (`"pkg.mod:fn"`, `"file.py:fn"`,
            `"builtin:NAME"`; None for the default), or a function taking no
            arguments that returns a compiled Keras model or `(model, x, y)`.
            A function the runs cannot import (defined in a notebook, `python
            -c` or `__main__`) is passed by value: see "Callables" below.
        progress: Called with one line of text per event (`print` shows
            them); None: silent.
        **options: `tfdet._commands._options.RunOptions` fields. `perturb` may
            also be a string as `--perturb` takes it (`"all"`, `"none"`,
            `"affinity,hashseed"`).

    Callables: a function is re-created in each run from its compiled code,
    with the globals it reads: modules are re-imported, helper functions of
    the same script are passed the same way, other values are pickled. Build
    anything that cannot be pickled inside the function.

    Returns:
        A `CheckReport`; `exit_code` is what `tfdet check` would exit with.

    Raises:
        TargetError: `target` cannot be parsed, passed to the runs or built.
        DeviceUnavailableError: `device="gpu"` without a visible GPU.
        ValueError: an option out of range.
        TypeError: an option `tfdet check` does not have.
    """
    if isinstance(options.get("perturb"), str):
        options["perturb"] = tuple(_perturb.parse(options["perturb"]))
    unknown = sorted(set(options) - {f.name for f in _option_fields()})
    if unknown:
        raise TypeError(
            f"Expected options among {', '.join(f.name for f in _option_fields())}. "
            f"Received: {', '.join(f'{name}=' for name in unknown)}"
        )
    if target is None or isinstance(target, str):
        return check_with_options(RunOptions(target=target, **options), progress)
    if not callable(target):
        raise TargetError(
            "Expected `target` to be a TARGET string or a function. Received: "
            f"target={target!r}"
        )
    name = _importable_name(target)
    if name is not None:
        return _check_named(_by_path(target) or name, name, options, progress)
    if not isinstance(target, types.FunctionType):
        # A functools.partial, a bound method, a callable object: the runs
        # could only get it by pickling, which tfdet never loads in a run.
        raise TargetError(
            "Expected `target` to be a function (def or lambda) or a TARGET "
            f"string. Received: {target!r}, a {type(target).__name__}. Wrap it: "
            "`def build(): return make_model(units=64)`, and pass `build`."
        )
    with _written(target) as text:
        return _check_named(
            text, f"{target.__module__}:{target.__qualname__}", options, progress
        )


def _check_named(
    text: str, described: str, options: dict[str, Any], progress: Any
) -> CheckReport:
    """The check of TARGET `text`, whose report and errors say `described`.

    `text` may be a path the user never wrote (tfdet's temporary module, the
    file of a module they imported by name): they know the function by
    `described`, "module:function".
    """
    try:
        report = check_with_options(RunOptions(target=text, **options), progress)
    except TargetError as error:
        raise TargetError(str(error).replace(text, described)) from None
    return dataclasses.replace(report, target=described)


def _signature() -> inspect.Signature:
    """`check`'s signature with every option and its default, from `RunOptions`."""
    own = inspect.signature(check).parameters
    return inspect.Signature(
        [
            own["target"],
            *(
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default
                )
                for f in _option_fields()
            ),
            own["progress"],
        ],
        return_annotation=CheckReport,
    )


check.__signature__ = _signature()  # type: ignore[attr-defined]


def _importable_name(function: Callable[..., Any]) -> str | None:
    """`"module:function"` when a fresh process can import `function` by name."""
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", "")
    if (
        not module
        or module == "__main__"
        or "<" in qualname
        or "." in qualname
        or getattr(sys.modules.get(module), qualname, None) is not function
    ):
        return None
    return f"{module}:{qualname}"


def _by_path(function: Callable[..., Any]) -> str | None:
    """`"/path/module.py:function"` for a function of a top-level module file.

    A module found through a `sys.path` entry added at run time (a notebook's
    `sys.path.insert(0, "src")`) cannot be imported by name in a fresh
    process; by its file it can, and its siblings with it (the runs put the
    file's folder first on their path, as `python file.py` does). A module of
    a package keeps its name: its relative imports need the package.
    """
    module = sys.modules.get(function.__module__)
    path = getattr(module, "__file__", None) or ""
    if "." in function.__module__ or not path.endswith(".py"):
        return None
    return f"{os.path.abspath(path)}:{function.__qualname__}"


def _defined_in_main(value: Any) -> bool:
    """Whether `value` is a class of `__main__`, or an instance of one."""
    cls = value if isinstance(value, type) else type(value)
    return cls.__module__ == "__main__"


def _names(code: types.CodeType) -> Iterator[str]:
    """The global names `code` and its nested code (lambdas, ...) read."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _module_source(function: types.FunctionType) -> str:
    """Python source re-creating `function` (and what it reads) in a run."""
    lines = [
        f"# Written by tfdet.check() for {function.__module__}:"
        f"{function.__qualname__}: its compiled code and the globals it reads.",
        "import importlib, marshal, pickle, types",
        "_G = globals()",
    ]
    done: dict[int, str] = {}
    lines_defined: set[str] = set()

    def define(fn: Any, as_name: str) -> None:
        if not isinstance(fn, types.FunctionType):
            raise TargetError(
                f"Expected `target` to be a Python function. Received: {fn!r}. "
                "Wrap it: `def build(): return ...`."
            )
        if fn.__closure__:
            raise TargetError(
                f"Expected `target` to read no variables of an enclosing function. "
                f"Received: {fn.__qualname__} reads "
                f"{', '.join(fn.__code__.co_freevars)}. Define it at the top level "
                "of the notebook or script, or pass a TARGET string."
            )
        done[id(fn)] = as_name
        for name in dict.fromkeys(_names(fn.__code__)):
            if name not in fn.__globals__ or name in lines_defined:
                continue
            value = fn.__globals__[name]
            lines_defined.add(name)
            if isinstance(value, types.ModuleType):
                lines.append(
                    f"_G[{name!r}] = importlib.import_module({value.__name__!r})"
                )
            elif (
                isinstance(value, types.FunctionType)
                and _importable_name(value) is None
            ):
                if id(value) not in done:
                    define(value, name)
            elif _defined_in_main(value):
                # Pickled by reference to `__main__`, which in a run is
                # tfdet's own: it would fail there with a puzzling message.
                raise TargetError(
                    f"Expected the globals `target` reads to be importable by a "
                    f"fresh process. Received: {name}, "
                    f"{'a class' if isinstance(value, type) else 'an instance of a class'}"
                    " defined in __main__ (a notebook, `python -c` or the script "
                    "itself), which the runs cannot import. Move it into a module "
                    "file beside the notebook (e.g. `layers.py`) and import it "
                    "from there, or define it inside the function."
                )
            else:
                try:
                    data = pickle.dumps(value)
                except Exception as error:  # noqa: BLE001 - any pickling failure
                    raise TargetError(
                        f"Expected the globals `target` reads to be modules, "
                        f"functions or picklable values. Received: {name}="
                        f"{type(value).__name__} ({error!r}). Make or import it "
                        "inside the function."
                    ) from error
                lines.append(f"_G[{name!r}] = pickle.loads({data!r})")
        defaults = pickle.dumps((fn.__defaults__, fn.__kwdefaults__))
        lines.append(
            f"_G[{as_name!r}] = _f = types.FunctionType(marshal.loads("
            f"{marshal.dumps(fn.__code__)!r}), _G, {fn.__name__!r})"
        )
        lines.append(f"_f.__defaults__, _f.__kwdefaults__ = pickle.loads({defaults!r})")

    define(function, _ENTRY)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _written(function: Callable[..., Any]) -> Iterator[str]:
    """A temporary `file.py:tfdet_target` TARGET re-creating `function`."""
    source = _module_source(function)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory(prefix="tfdet-target-") as directory:
        path = os.path.join(directory, "tfdet_target.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(source)
        yield f"{path}:{_ENTRY}"
