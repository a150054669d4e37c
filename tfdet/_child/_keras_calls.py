"""What a hook reads and changes in the arguments of a Keras training call.

Shared by the hooks of a script's run (`_script_hooks`) and of `tfdet
cost`'s script (`_cost_script`): `fit`'s callbacks, wherever the caller
passed them, and the variables an optimizer update trains (Keras 3's
`Optimizer.apply`, tf_keras's `apply_gradients`).
"""

from __future__ import annotations

from typing import Any


def with_fit_callback(
    args: tuple[Any, ...], kwargs: dict[str, Any], callback: Any
) -> tuple[list[Any], dict[str, Any]]:
    """`fit`'s arguments with `callback` appended to its callbacks, wherever
    the caller passed them: `fit(x, y, batch_size, epochs, verbose, callbacks)`
    positionally, or by keyword."""
    args_list, kwargs = list(args), dict(kwargs)
    if len(args_list) > 5:
        args_list[5] = [*(args_list[5] or []), callback]
    else:
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
    return args_list, kwargs


def keras3_variables(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The variables of a Keras 3 `Optimizer.apply(grads, trainable_variables)`."""
    variables = kwargs.get("trainable_variables", args[1] if len(args) > 1 else None)
    return (
        list(variables)
        if variables is not None
        else list(optimizer._trainable_variables)
    )


def tf_keras_variables(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The variables of a tf_keras `apply_gradients(grads_and_vars)`."""
    pairs = kwargs.get("grads_and_vars", args[0] if args else [])
    return [variable for _, variable in pairs]
