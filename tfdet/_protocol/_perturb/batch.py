"""`batch` (opt-in): run 1 predicts its inputs in another order and other batches."""

from __future__ import annotations

from tfdet import _variables
from tfdet._protocol import _predict
from tfdet._protocol._perturb._records import Change, Context, Perturbation

BATCH = "batch"


def _change(index: int, context: Context) -> Change:
    if index == 0:
        return Change(
            "predicted its inputs in one batch, in order",
            env={_variables.PREDICT: _predict.WHOLE},
        )
    sizes = ", ".join(map(str, _predict.SPLIT_SIZES))
    return Change(
        f"predicted its inputs in another order, in batches of {sizes} in turn",
        env={_variables.PREDICT: _predict.SPLIT},
        by_child=True,
    )


def _in_child() -> str | None:
    if _predict.requested() != _predict.SPLIT:
        return None  # Run 0 predicts too, as asked; nothing to confirm.
    return "predicts its inputs in another order and other batch sizes"


PERTURBATION = Perturbation(
    name=BATCH,
    description="after training, run 1 predicts the TARGET's "
    "inputs in another order and in batches of 1, 5 and 32, run 0 "
    "in one batch, and each sample's output bits are compared: "
    "batch invariance (opt-in; TARGETs)",
    imitates="Another batch around each sample at prediction: "
    "what else is in it and where the sample sits (a served "
    "model's request batching, predict on one sample).",
    default=False,
    other_machine=False,
    unavailable=lambda context: context.not_predicting,
    change=_change,
    in_child=_in_child,
)
