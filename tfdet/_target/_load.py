"""TARGET: what `check`, `locate` and `scan` train.

A TARGET is `package.module:function`, `path/to/file.py:function`, or
`builtin:NAME` (see `tfdet._target._builtins`); None means `builtin:cnn`. The function
takes no arguments and returns a compiled Keras model, `(model, x, y)` with
arrays (or lists/dicts of arrays) whose first axis is samples, or `(model,
dataset)` / `(model, dataset, None)` with a `tf.data.Dataset` or a Keras
`PyDataset` whose elements are batches `(x, y)` or `(x, y, sample_weight)`,
taken in order. Without data, batches are synthesized from the model's input
and output specs with a seeded NumPy generator.

`run` is the preflight: `tfdet._runner._spawn.preflight` builds the TARGET
once in a child process before any run is spawned, so that a TARGET that
exits, hangs, or returns data tfdet cannot train on fails with exit 2 or 3
and a message, never with another command's verdict or exit code.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tfdet._errors import TargetError
from tfdet._graph import _layers
from tfdet._target import _builtins, _feeding

DEFAULT_TARGET = "builtin:cnn"
DEFAULT_BATCH_SIZE = 32
_SYNTHETIC_BATCHES = 2


def _exit_message(what: str, exit_: SystemExit) -> str:
    return (
        f"the TARGET called sys.exit({exit_.code!r}) while {what}; a TARGET "
        "function must return a model, not exit (move a script's "
        "`sys.exit(main())` under `if __name__ == '__main__':`)"
    )


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """A parsed TARGET string.

    Attributes:
        text: The TARGET as given (or the default).
        legacy_keras: Whether the target needs `TF_USE_LEGACY_KERAS=1` in the
            process that builds it (set by the parent before spawning).
    """

    text: str
    legacy_keras: bool = False


LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
# The values TensorFlow itself takes as "use tf_keras"
# (`_versions.uses_legacy_keras`).
_LEGACY_ON = frozenset({"1", "true", "True"})


def _constant(node: ast.AST) -> Any:
    return node.value if isinstance(node, ast.Constant) else None


def _turns_legacy_keras_on(node: ast.AST) -> bool:
    """Whether one statement or call sets TF_USE_LEGACY_KERAS to an "on" value.

    `os.environ["TF_USE_LEGACY_KERAS"] = "1"`, `os.environ.setdefault(...,
    "true")`, `os.putenv(...)`, `os.environ.update({...: "1"})`.
    """
    if isinstance(node, ast.Assign):
        return _constant(node.value) in _LEGACY_ON and any(
            isinstance(target, ast.Subscript)
            and _constant(target.slice) == LEGACY_KERAS
            for target in node.targets
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        arguments = [_constant(argument) for argument in node.args]
        if node.func.attr in ("setdefault", "putenv") and len(arguments) == 2:
            return arguments[0] == LEGACY_KERAS and arguments[1] in _LEGACY_ON
        if node.func.attr == "update" and node.args:
            mapping = node.args[0]
            return isinstance(mapping, ast.Dict) and any(
                _constant(key) == LEGACY_KERAS and _constant(value) in _LEGACY_ON
                for key, value in zip(mapping.keys, mapping.values, strict=True)
                if key is not None
            )
    return False


def sets_legacy_keras(path: str) -> bool:
    """Whether the Python file at `path` turns on TF_USE_LEGACY_KERAS itself.

    Such a file chooses tf_keras before importing TensorFlow, which works
    under `python file.py` but not in a process where Keras 3 is already
    imported (tfdet imports it first): its runs must get the variable in
    their environment instead. Decided from the file's code (parsed, never
    imported): a commented-out line or a string that mentions the variable
    does not count.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return False
    return any(_turns_legacy_keras_on(node) for node in ast.walk(tree))


def parse(text: str | None) -> TargetSpec:
    """Parses a TARGET string without importing it.

    Raises:
        TargetError: the string is not of the form `module:function`,
            `file.py:function` or `builtin:NAME`.
    """
    text = text or DEFAULT_TARGET
    module, sep, function = text.rpartition(":")
    if not sep or not module or not function:
        raise TargetError(
            "Expected TARGET as `package.module:function`, `path/to/file.py:"
            f"function` or `builtin:NAME` ({', '.join(_builtins.names())}). "
            f"Received: {text!r}"
        )
    if module == "builtin":
        builtin = _builtins.get(function)  # Raises TargetError when unknown.
        if builtin.legacy_keras and importlib.util.find_spec("tf_keras") is None:
            raise TargetError(
                f"Expected tf_keras to be installed for {text!r}. Install the one "
                "matching TensorFlow: `pip install --no-deps tf_keras==<TF version>`."
            )
        return TargetSpec(text, legacy_keras=builtin.legacy_keras)
    if module.endswith(".py"):
        return TargetSpec(text, legacy_keras=sets_legacy_keras(module))
    return TargetSpec(text)


def _prepend_to_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)


def load_function(spec: TargetSpec) -> Callable[[], Any]:
    """Imports the TARGET's function.

    Raises:
        TargetError: no such module, file or function.
    """
    module_name, _, function_name = spec.text.rpartition(":")
    if module_name == "builtin":
        return _builtins.get(function_name).function
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise TargetError(
                f"Expected TARGET's file to exist. No such file: {module_name!r}"
            )
        # A name that is the same in every run (hash() is salted by
        # PYTHONHASHSEED, one of the perturbations).
        unique = "tfdet_target_" + hashlib.sha256(path.encode()).hexdigest()[:16]
        module_spec = importlib.util.spec_from_file_location(unique, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(
                f"Expected TARGET's file to be a Python module. Received: {module_name!r}"
            )
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[unique] = module
        # As `python file.py` does: the file's siblings are importable, also
        # lazily from inside the function.
        _prepend_to_path(os.path.dirname(path))
        legacy_before = _keras_chosen()
        try:
            module_spec.loader.exec_module(module)
        except SystemExit as exit_:
            raise TargetError(
                _exit_message(f"{module_name!r} was imported", exit_)
            ) from None
        except Exception as error:
            _check_keras_choice(module_name, legacy_before)
            raise TargetError(f"Importing {module_name!r} failed: {error!r}") from error
        _check_keras_choice(module_name, legacy_before)
    else:
        # As `python -m` does: modules in the working directory are importable,
        # also from the `tfdet` console script.
        _prepend_to_path(os.getcwd())
        legacy_before = _keras_chosen()
        try:
            module = importlib.import_module(module_name)
        except SystemExit as exit_:
            raise TargetError(
                _exit_message(f"{module_name!r} was imported", exit_)
            ) from None
        except Exception as error:  # An import can fail in any way.
            _check_keras_choice(module_name, legacy_before)
            raise TargetError(
                f"Expected TARGET's module to be importable. Received: "
                f"{module_name!r} ({error!r})"
            ) from error
        _check_keras_choice(module_name, legacy_before)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TargetError(
            f"Expected a function `{function_name}` in {module_name!r}. "
            f"Received: {type(function).__name__ if function is not None else 'nothing'}"
        )
    return function


def _legacy_keras_on() -> bool:
    from tfdet._pin import _versions

    return _versions.uses_legacy_keras()


def _keras_chosen() -> bool | None:
    """Before importing TARGET: whether tf_keras is on, or None when no
    Keras choice was made yet (neither TensorFlow nor Keras imported)."""
    if "tensorflow" not in sys.modules and "keras" not in sys.modules:
        return None
    return _legacy_keras_on()


def _check_keras_choice(module_name: str, legacy_before: bool | None) -> None:
    """Fails when importing TARGET turned TF_USE_LEGACY_KERAS on too late.

    The variable only counts before TensorFlow picks its Keras; here tfdet
    had imported Keras 3 already, so the TARGET would build a tf_keras model
    with Keras 3 parts (or fail with "Could not interpret optimizer
    identifier", or silently build a Keras 3 model: `from tensorflow.keras
    import layers` follows the choice TensorFlow made when it was imported).

    Raises:
        TargetError: the module set it in this process after TensorFlow or
            Keras was imported.
    """
    if legacy_before is not False or not _legacy_keras_on():
        return
    raise TargetError(
        f"Expected TF_USE_LEGACY_KERAS to be set before tfdet imports Keras. "
        f"Received: {module_name!r} sets TF_USE_LEGACY_KERAS=1 when imported, "
        "after tfdet had imported Keras 3. Set TF_USE_LEGACY_KERAS=1 in the "
        "environment (e.g. `TF_USE_LEGACY_KERAS=1 tfdet check ...`)."
    )


@dataclasses.dataclass
class Built:
    """A built TARGET: a compiled model and the data it trains on.

    Attributes:
        model: The compiled Keras model.
        x: Inputs (an array, or a list/dict of arrays), first axis = samples;
            None when the data is a dataset.
        y: Targets, same layout.
        batch_size: Samples per `train_on_batch` call (None for a dataset,
            whose elements are batches).
        synthesized: Whether the data was made up by tfdet.
        dataset: A `tf.data.Dataset` or Keras `PyDataset`, or None.
    """

    model: Any
    x: Any
    y: Any
    batch_size: int | None
    synthesized: bool
    dataset: Any = None
    _batches: list[tuple[Any, ...]] = dataclasses.field(
        default_factory=list, repr=False
    )
    _iterator: Any = dataclasses.field(default=None, repr=False)
    _epoch: int | None = dataclasses.field(default=None, repr=False)

    def batch(self, step: int) -> tuple[Any, Any]:
        """The `(x, y)` batch for `step`, cycling through the data."""
        return self._element(step)[:2]  # type: ignore[return-value]

    def sample_weight(self, step: int) -> Any:
        """The batch's sample weights (dataset elements of 3), or None."""
        element = self._element(step)
        return element[2] if len(element) > 2 else None

    def _element(self, step: int) -> tuple[Any, ...]:
        if self.dataset is None:
            # Arrays always come with their batch size (`build` sets it).
            assert self.batch_size is not None
            count = num_samples(self.x)
            batches = max(1, count // self.batch_size)
            start = (step % batches) * self.batch_size
            end = min(start + self.batch_size, count)
            return _slice(self.x, start, end), _slice(self.y, start, end)
        if _is_py_dataset(self.dataset):
            return _as_element(self.dataset[step % len(self.dataset)])
        # A tf.data.Dataset is read once, in order; its batches are kept so
        # that steps past its end cycle through it, as the array data does.
        while self._epoch is None and step >= len(self._batches):
            if self._iterator is None:
                self._iterator = iter(self.dataset)
            try:
                element = next(self._iterator)
            except StopIteration:
                self._epoch = len(self._batches)
                break
            self._batches.append(_as_element(element))
        if not self._batches:
            raise TargetError("Expected a dataset with batches. Received: none")
        if self._epoch is not None:
            step %= self._epoch
        return self._batches[step]


def num_samples(data: Any) -> int:
    """Length of the first axis of `data` (an array, or a list/dict of them)."""
    if isinstance(data, dict):
        data = next(iter(data.values()))
    if isinstance(data, list | tuple):
        data = data[0]
    return int(np.shape(data)[0])


def _slice(data: Any, start: int, end: int) -> Any:
    if isinstance(data, dict):
        return {key: value[start:end] for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [value[start:end] for value in data]
    return data[start:end]


def _as_element(element: Any) -> tuple[Any, ...]:
    """A dataset element as `(x, y)` or `(x, y, sample_weight)`."""
    if isinstance(element, list):
        element = tuple(element)
    if not isinstance(element, tuple) or len(element) not in (2, 3):
        received = (
            f"a tuple of {len(element)}"
            if isinstance(element, tuple)
            else type(element).__name__
        )
        raise TargetError(
            "Expected each dataset element to be a batch `(x, y)` or `(x, y, "
            f"sample_weight)`. Received: {received}. tfdet trains with "
            "`train_on_batch`, which needs targets: map the dataset to (x, y) "
            "pairs and batch it."
        )
    return element


def _is_tf_dataset(data: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _is_py_dataset(data: Any) -> bool:
    # Keras 3 `PyDataset` and tf_keras `Sequence`: indexable batches.
    return (
        hasattr(data, "__getitem__")
        and hasattr(data, "__len__")
        and not isinstance(data, np.ndarray | list | tuple | dict | str | bytes)
        and any(cls.__name__ in ("PyDataset", "Sequence") for cls in type(data).__mro__)
    )


def _describe(data: Any) -> str:
    shape = getattr(data, "shape", None)
    kind = type(data).__name__
    return f"{kind} of shape {tuple(shape)}" if shape is not None else kind


def _check_arrays(text: str, x: Any, y: Any) -> None:
    """x and y are arrays with the same, non-zero number of samples."""
    counts = []
    for name, data in (("x", x), ("y", y)):
        try:
            counts.append(num_samples(data))
        except (TypeError, IndexError, StopIteration, ValueError):
            raise TargetError(
                f"Expected TARGET {text!r} to return (model, x, y) with arrays "
                "(or lists/dicts of arrays) whose first axis is samples, or "
                "(model, dataset) with a tf.data.Dataset or keras PyDataset. "
                f"Received: {name}={_describe(data)}"
            ) from None
    if counts[0] != counts[1]:
        raise TargetError(
            f"Expected x and y of TARGET {text!r} to have as many samples. "
            f"Received: {counts[0]} in x, {counts[1]} in y"
        )
    if counts[0] == 0:
        raise TargetError(
            f"Expected TARGET {text!r} to return at least one sample. Received: "
            "x and y with 0 samples"
        )


def _is_keras_model(model: Any) -> bool:
    classes = []
    try:
        import keras

        classes.append(keras.Model)
    except ImportError:  # pragma: no cover
        pass
    if "tf_keras" in sys.modules:
        classes.append(sys.modules["tf_keras"].Model)
    return bool(classes) and isinstance(model, tuple(classes))


def _is_compiled(model: Any) -> bool:
    # Keras 3 sets `compiled`; tf_keras (eager and v1 graph models) `_is_compiled`.
    return bool(
        getattr(model, "compiled", False) or getattr(model, "_is_compiled", False)
    )


def build(text: str | None, seed: int = 0) -> Built:
    """Imports and calls the TARGET's function, and prepares its data.

    Args:
        text: The TARGET string (None: the built-in CNN).
        seed: Seed of the generator that synthesizes data.

    Raises:
        TargetError: the target cannot be loaded, exits, or does not return a
            compiled Keras model (or a model and data tfdet can train on).
    """
    spec = parse(text)
    function = load_function(spec)
    try:
        result = function()
    except TargetError:
        raise
    except SystemExit as exit_:
        raise TargetError(_exit_message("being built", exit_)) from None
    except Exception as error:
        raise TargetError(f"TARGET {spec.text!r} raised {error!r}") from error
    expected = (
        f"Expected TARGET {spec.text!r} to return a compiled Keras model, "
        "(model, x, y), or (model, dataset) with a tf.data.Dataset or keras "
        "PyDataset of (x, y) batches."
    )
    x = y = dataset = None
    if isinstance(result, tuple):
        if len(result) == 3 and _is_dataset(result[1]) and result[2] is None:
            result = result[:2]  # `(model, dataset, None)`, as for `fit`.
        if len(result) == 2 and _is_dataset(result[1]):
            model, dataset = result
        elif len(result) == 3 and not _is_dataset(result[1]):
            model, x, y = result
        else:
            kinds = ", ".join(type(item).__name__ for item in result)
            raise TargetError(
                f"{expected} Received: a tuple of {len(result)} ({kinds})"
            )
    else:
        model = result
    if not _is_keras_model(model):
        raise TargetError(f"{expected} Received: {type(model).__name__}")
    if not _is_compiled(model):
        raise TargetError(
            f"Expected TARGET {spec.text!r} to return a compiled model. Call "
            "`model.compile(optimizer=..., loss=...)` before returning it."
        )
    # A model whose own train_step computes its loss (keras.io's "going
    # lower-level" example) compiles without one, as `fit` allows.
    if (
        getattr(model, "loss", None) is None
        and _feeding.overriding_class(model) is None
    ):
        raise TargetError(
            f"Expected TARGET {spec.text!r} to return a model compiled with a "
            "loss. Received: loss=None. Pass `loss=...` to `model.compile`, or "
            "compute the loss in the model's own `train_step`."
        )
    if dataset is not None:
        return Built(model, None, None, None, synthesized=False, dataset=dataset)
    if x is None:
        x, y = synthesize(model, seed)
        return Built(model, x, y, DEFAULT_BATCH_SIZE, synthesized=True)
    _check_arrays(spec.text, x, y)
    batch_size = min(DEFAULT_BATCH_SIZE, num_samples(x))
    return Built(model, x, y, batch_size, synthesized=False)


def _is_dataset(data: Any) -> bool:
    return _is_tf_dataset(data) or _is_py_dataset(data)


def check_fits(built: Built, text: str) -> None:
    """The first batch has the shape of the model's inputs.

    Compared with the model's symbolic inputs (a model without them, e.g. a
    subclassed one, is not checked), in the preflight: a model whose inputs do
    not fit its data fails there with exit 2 instead of in every run. The
    TARGET's training step itself is left to the runs, whose failure is exit 3.

    Raises:
        TargetError: a batch is not `(x, y)`, or x does not fit the inputs.
    """
    x, _ = built.batch(0)
    inputs = getattr(built.model, "inputs", None)
    if not inputs or isinstance(x, dict):
        return
    arrays = list(x) if isinstance(x, list | tuple) else [x]
    if len(arrays) != len(inputs):
        raise TargetError(
            f"Expected x of TARGET {text!r} to hold one array per model input "
            f"({len(inputs)}). Received: {len(arrays)}"
        )
    for index, (array, tensor) in enumerate(zip(arrays, inputs, strict=True)):
        want = tuple(tensor.shape)[1:]
        got = tuple(np.shape(array))
        if len(got) != len(want) + 1 or any(
            w is not None and w != g for w, g in zip(want, got[1:], strict=True)
        ):
            shape = ", ".join(
                ["batch", *("None" if w is None else str(w) for w in want)]
            )
            raise TargetError(
                f"Expected input {index} of TARGET {text!r} to have the shape of "
                f"the model's input, ({shape}). Received: a batch of shape {got}"
            )


def _loss_name(model: Any) -> str:
    loss = getattr(model, "loss", None)
    if isinstance(loss, dict | list | tuple):
        loss = next(iter(loss.values())) if isinstance(loss, dict) else loss[0]
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    return (name or type(loss).__name__).lower()


def _vocabulary_size(model: Any) -> int:
    sizes = [
        int(layer.input_dim)
        for layer in _layers.descendants(model)
        if type(layer).__name__ == "Embedding" and hasattr(layer, "input_dim")
    ]
    return min(sizes) if sizes else 2


def synthesize(model: Any, seed: int) -> tuple[Any, Any]:
    """Seeded inputs and labels from the model's input and output specs.

    Integer inputs draw from [0, vocabulary) where vocabulary is the smallest
    Embedding `input_dim` in the model (2 without Embeddings). Labels follow
    the loss: class indices for sparse losses, one-hot for categorical ones,
    0/1 for binary ones, standard normal otherwise.

    Raises:
        TargetError: the model has no symbolic inputs (subclassed and not
            built): return `(model, x, y)` instead.
    """
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise TargetError(
            "Expected a model with known input and output shapes to synthesize "
            "data (a Sequential or functional model built from `keras.Input`). "
            "For a subclassed model, return `(model, x, y)` from the TARGET."
        )
    rng = np.random.default_rng(seed)
    count = DEFAULT_BATCH_SIZE * _SYNTHETIC_BATCHES
    xs = []
    for tensor in inputs:
        shape = (
            count,
            *[int(d) if d is not None else 1 for d in tuple(tensor.shape)[1:]],
        )
        dtype = np.dtype(getattr(tensor.dtype, "name", tensor.dtype))
        if np.issubdtype(dtype, np.integer):
            xs.append(
                rng.integers(0, _vocabulary_size(model), size=shape).astype(dtype)
            )
        else:
            xs.append(rng.random(shape, dtype=np.float32).astype(dtype))
    loss = _loss_name(model)
    ys: list[np.ndarray] = []
    for tensor in outputs:
        shape = (
            count,
            *[int(d) if d is not None else 1 for d in tuple(tensor.shape)[1:]],
        )
        classes = shape[-1] if len(shape) > 1 else 1
        if "sparse" in loss:
            ys.append(
                rng.integers(0, max(classes, 2), size=shape[:-1]).astype(np.int32)
            )
        elif "categorical" in loss:
            ys.append(
                np.eye(classes, dtype=np.float32)[
                    rng.integers(0, classes, size=shape[:-1])
                ]
            )
        elif "binary" in loss:
            ys.append(rng.integers(0, 2, size=shape).astype(np.float32))
        else:
            ys.append(rng.standard_normal(shape).astype(np.float32))
    return (xs[0] if len(xs) == 1 else xs), (ys[0] if len(ys) == 1 else ys)
