"""Keeps Keras LSTM and GRU layers off the cuDNN kernels (opt-in).

On a GPU both Keras generations run LSTM and GRU through `CudnnRNNV3` and
its backprop whenever the layer's configuration allows it. Op determinism
does not refuse these ops, and they were reported to give different results
from run to run (tensorflow/tensorflow#59281). Where tfdet measured them
under op determinism they repeated their bits, and this patch makes an
LSTM+GRU model several times slower per step (docs/measurements.md, "cuDNN
LSTM/GRU under op determinism"). So the patch is opt-in (`tfdet.enable(patches=["auto", "cudnn_rnn"])`),
for a GPU or cuDNN version where `benchmarks/cudnn_rnn_repeatability.py`
finds a configuration that does not repeat. It makes both Keras generations
take the implementation they already use where cuDNN is unavailable:

- Keras 3: its TensorFlow backend asks `rnn.cudnn_ok(...)` before trying
  cuDNN; the patch answers no, so the layer falls back to its generic loop
  (`keras.src.backend.tensorflow.rnn`, the same code path a CPU takes). The
  layer's constructor asks the same question through another name and
  still marks itself as not XLA-compilable.
- tf_keras: eagerly it picks cuDNN when a GPU is visible and
  `gru_lstm_utils.is_cudnn_supported_inputs(...)` holds (the patch answers
  no); inside a `tf.function` it registers a cuDNN function for Grappler's
  implementation selector to swap in on GPU (`lstm_with_backend_selection`,
  `gru_with_backend_selection`), which the patch replaces with a direct call
  of the standard implementation that the selector would keep on a CPU.

The replacement is Keras' own generic implementation, built from MatMul,
BiasAdd, element-wise ops and a While loop, all deterministic on GPU. On a
CPU nothing changes: Keras already takes these paths there, and the tests
check that outputs and gradients are bit-identical with and without the
patch. On a GPU the results differ from cuDNN's by rounding (cuDNN fuses
the gate matrix products differently). A layer built with `use_cudnn=True`
(Keras 3) then raises Keras' own error, as it does on a CPU.

When tf_keras is installed but not imported yet, its half waits for the
import (the patch's `after_import`), as `sparse_optimizer_update` does.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from tfdet._patching._registry import Patch
from tfdet._patching._swap import Swap

NAME = "cudnn_rnn"


def keras3_rnn_module() -> Any:
    """`keras.src.backend.tensorflow.rnn`, or None without Keras 3 on TF.

    Imported by name: the package `keras.src.backend.tensorflow` exports a
    function called `rnn` that hides the module of the same name.
    """
    try:
        import keras
    except ImportError:
        return None
    if keras.config.backend() != "tensorflow":
        return None
    return importlib.import_module("keras.src.backend.tensorflow.rnn")


def _no_cudnn(*args: Any, **kwargs: Any) -> bool:
    """Answers "cuDNN cannot run this" whatever the layer's configuration."""
    del args, kwargs
    return False


_no_cudnn.__tfdet_patch__ = NAME  # type: ignore[attr-defined]


def _standard_only(standard: Callable[..., Any]) -> Callable[..., Any]:
    """A `*_with_backend_selection` that only ever runs `standard`."""

    @functools.wraps(standard)
    def without_cudnn(*args: Any, **kwargs: Any) -> Any:
        return standard(*args, **kwargs)

    without_cudnn.__tfdet_patch__ = NAME  # type: ignore[attr-defined]
    return without_cudnn


def _patch_keras3(swap: Swap) -> None:
    rnn = keras3_rnn_module()
    if rnn is not None:
        swap.attribute(rnn, "cudnn_ok", _no_cudnn)


def _patch_tf_keras(swap: Swap) -> None:
    from tf_keras.src.layers.rnn import gru, gru_lstm_utils, lstm

    swap.attribute(gru_lstm_utils, "is_cudnn_supported_inputs", _no_cudnn)
    swap.attribute(
        lstm, "lstm_with_backend_selection", _standard_only(lstm.standard_lstm)
    )
    swap.attribute(gru, "gru_with_backend_selection", _standard_only(gru.standard_gru))


PATCH = Patch(
    name=NAME,
    replaces=(
        "CudnnRNN",
        "CudnnRNNV2",
        "CudnnRNNV3",
        "CudnnRNNBackprop",
        "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3",
    ),
    summary="Keras LSTM/GRU cuDNN kernels (CudnnRNNV3) -> Keras' generic implementation "
    "(opt-in: cuDNN repeated its bits under op determinism where measured)",
    upstream="https://github.com/tensorflow/tensorflow/issues/59281",
    apply=_patch_keras3,
    after_import=(("tf_keras", _patch_tf_keras),),
    opt_in=True,
)
