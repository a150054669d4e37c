"""A batch handed to a model's `train_step` as `fit` hands it.

`tfdet check`, `locate` and `cost` drive a TARGET one batch a step through
`Model.train_on_batch`, so that every step's loss bits can be compared. Keras
3's `train_on_batch` hands `train_step` the tuple `(x, y, sample_weight)`
even when there is no sample weight, where `fit` hands it `(x, y)`: a
`train_step` written as the keras.io guide "Customizing what happens in
`fit()`" writes it (`x, y = data`) trains under `fit` and fails under
`train_on_batch` with "too many values to unpack". `feed_as_fit` makes the
model's `train_step` receive what `fit` gives it: `(x, y)` with no sample
weight, `(x, y, sample_weight)` with one. Keras's own `train_step` unpacks
both alike (`unpack_x_y_sample_weight`), so its bits do not change.
tf_keras's `train_on_batch` already packs its batch as its `fit` does.

A model that overrides `train_step` and still cannot take the batch gets a
`TargetError` (exit 2) that names its `train_step`, what it was given, and
what to do, instead of Keras's traceback.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from tfdet._errors import TargetError


def overriding_class(model: Any) -> type | None:
    """The class that overrides Keras's `train_step`, or None.

    Keras's own classes (keras.Model, Sequential, Functional, tf_keras's) do
    not count: their step is the one `compile` configures.
    """
    for klass in type(model).__mro__:
        if "train_step" in vars(klass):
            if klass.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow"):
                return None
            return klass
    return None


def custom_train_step(model: Any) -> str | None:
    """`overriding_class` named with where it is defined, or None.

    Returns:
        `Class (file.py, line N)`, or the class's name where its source is
        not known.
    """
    klass = overriding_class(model)
    if klass is None:
        return None
    try:
        where = inspect.getsourcefile(klass)
        line = inspect.getsourcelines(klass)[1]
    except (OSError, TypeError):
        return klass.__qualname__
    if where is None:  # Defined where no source file is (an exec'd string).
        return klass.__qualname__
    return f"{klass.__qualname__} ({os.path.basename(where)}, line {line})"


def _as_fit_packs(data: Any) -> Any:
    """`(x, y, None)` becomes `(x, y)`, as `fit`'s data adapters pack it."""
    if isinstance(data, tuple) and len(data) == 3 and data[2] is None:
        return data[:2]
    return data


def _describe(data: Any) -> str:
    """A batch's structure: its parts' dtypes and shapes, never their values."""
    if isinstance(data, (tuple, list)):
        inner = ", ".join(_describe(part) for part in data)
        return f"({inner}{',' if len(data) == 1 else ''})"
    if isinstance(data, dict):
        inner = ", ".join(f"{key!r}: {_describe(part)}" for key, part in data.items())
        return "{" + inner + "}"
    if data is None:
        return "None"
    dtype = getattr(getattr(data, "dtype", None), "name", None) or getattr(
        data, "dtype", type(data).__name__
    )
    shape = getattr(data, "shape", None)
    shape_text = "" if shape is None else f" {tuple(shape)}"
    return f"{dtype}{shape_text}"


def feed_as_fit(model: Any, target: str) -> None:
    """Makes `model.train_on_batch` hand its `train_step` what `fit` would.

    Installs, on the model instance only, a `train_step` that drops the
    trailing `None` sample weight Keras 3's `train_on_batch` adds. Call it
    before the model's first step (its train function looks `train_step` up
    when it is made). Safe to call twice.

    Args:
        model: The TARGET's compiled Keras model.
        target: The TARGET as given, for the error message.

    Raises:
        TargetError: (from the first step) the model overrides `train_step`
            and it raised when given the batch as `fit` gives it.
    """
    if getattr(model, "_tfdet_fed_as_fit", False):
        return
    step = model.train_step
    custom = custom_train_step(model)

    @functools.wraps(step)
    def train_step(data: Any) -> Any:
        data = _as_fit_packs(data)
        try:
            return step(data)
        except (TypeError, ValueError, KeyError, IndexError) as error:
            if custom is None:  # Keras's own step: its error as it is.
                raise
            raise TargetError(
                f"Expected the train_step of {custom}, TARGET {target!r}, to "
                "take a batch as `fit` gives it. Received: "
                f"{_describe(data)}, and it raised "
                f"{type(error).__name__}: {error}. `tfdet check` feeds one batch a "
                "step, (x, y) or (x, y, sample_weight); if your script feeds it "
                "otherwise, check the script as it trains: "
                "`tfdet check --script train.py`."
            ) from error

    # Keras tracks attributes set on a model; these two are plain values.
    object.__setattr__(model, "train_step", train_step)
    object.__setattr__(model, "_tfdet_fed_as_fit", True)
