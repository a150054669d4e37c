"""TARGET: what `check`, `locate` and `scan` train.

A TARGET is `package.module:function`, `path/to/file.py:function`, or
`builtin:NAME` (see `tfdet._runs._builtins`); None means `builtin:cnn`. The function
takes no arguments and returns a compiled Keras model or `(model, x, y)`.
Without data, batches are synthesized from the model's input and output specs
with a seeded NumPy generator.
"""

from __future__ import annotations

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
from tfdet._runs import _builtins

DEFAULT_TARGET = "builtin:cnn"
DEFAULT_BATCH_SIZE = 32
_SYNTHETIC_BATCHES = 2


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
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[unique] = module
        # As `python file.py` does: the file's siblings are importable, also
        # lazily from inside the function.
        _prepend_to_path(os.path.dirname(path))
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            raise TargetError(f"Importing {module_name!r} failed: {error!r}") from error
    else:
        # As `python -m` does: modules in the working directory are importable,
        # also from the `tfdet` console script.
        _prepend_to_path(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # An import can fail in any way.
            raise TargetError(
                f"Expected TARGET's module to be importable. Received: "
                f"{module_name!r} ({error!r})"
            ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TargetError(
            f"Expected a function `{function_name}` in {module_name!r}. "
            f"Received: {type(function).__name__ if function is not None else 'nothing'}"
        )
    return function


@dataclasses.dataclass
class Built:
    """A built TARGET: a compiled model and the data it trains on.

    Attributes:
        model: The compiled Keras model.
        x: Inputs (an array, or a list/dict of arrays), first axis = samples.
        y: Targets, same layout.
        batch_size: Samples per `train_on_batch` call.
        synthesized: Whether the data was made up by tfdet.
    """

    model: Any
    x: Any
    y: Any
    batch_size: int
    synthesized: bool

    def batch(self, step: int) -> tuple[Any, Any]:
        """The batch for `step`, cycling through the data."""
        count = _num_samples(self.x)
        batches = max(1, count // self.batch_size)
        start = (step % batches) * self.batch_size
        end = min(start + self.batch_size, count)
        return _slice(self.x, start, end), _slice(self.y, start, end)


def _num_samples(data: Any) -> int:
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
        TargetError: the target cannot be loaded, or does not return a
            compiled Keras model (or a `(model, x, y)` tuple).
    """
    spec = parse(text)
    function = load_function(spec)
    try:
        result = function()
    except TargetError:
        raise
    except Exception as error:
        raise TargetError(f"TARGET {spec.text!r} raised {error!r}") from error
    x = y = None
    if isinstance(result, tuple):
        if len(result) != 3:
            raise TargetError(
                f"Expected TARGET {spec.text!r} to return a model or (model, x, y). "
                f"Received: a tuple of {len(result)}"
            )
        model, x, y = result
    else:
        model = result
    if not _is_keras_model(model):
        raise TargetError(
            f"Expected TARGET {spec.text!r} to return a compiled Keras model or "
            f"(model, x, y). Received: {type(model).__name__}"
        )
    if not _is_compiled(model):
        raise TargetError(
            f"Expected TARGET {spec.text!r} to return a compiled model. Call "
            "`model.compile(optimizer=..., loss=...)` before returning it."
        )
    if x is None:
        x, y = synthesize(model, seed)
        return Built(model, x, y, DEFAULT_BATCH_SIZE, synthesized=True)
    batch_size = min(DEFAULT_BATCH_SIZE, _num_samples(x))
    return Built(model, x, y, batch_size, synthesized=False)


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
        for layer in _all_layers(model)
        if type(layer).__name__ == "Embedding" and hasattr(layer, "input_dim")
    ]
    return min(sizes) if sizes else 2


def _all_layers(model: Any) -> list[Any]:
    layers = []
    for layer in getattr(model, "layers", []):
        layers.append(layer)
        if hasattr(layer, "layers"):
            layers.extend(_all_layers(layer))
    return layers


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
    ys = []
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
