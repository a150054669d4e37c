"""TensorFlow's view of the CPU's extensions, capped with oneDNN's ISA.

TensorFlow picks where some ops run from the extensions CPUID reports, not
from `ONEDNN_MAX_CPU_ISA`: on a CPU with AVX-512F (or AVX-NE-CONVERT) it
sends bfloat16 products, convolutions, pooling and activations to oneDNN;
elsewhere Eigen runs them. Under tfdet's AVX2 cap oneDNN has no bfloat16
kernel, so a `mixed_bfloat16` model failed on an AVX-512 CPU ("could not
create a primitive descriptor for the convolution forward propagation
primitive"; TF 2.21.0, AMD EPYC Zen 4 with AVX-512 BF16) while it trained on
an AVX2-only one.

This patch hides from TensorFlow every extension above the cap
(`tfdet._pin._cpu_features`), so every CPU at or above the cap makes
TensorFlow's choices as a CPU with exactly the cap's extensions would:
bfloat16 ops in Eigen, as on an AVX2 CPU, and a `mixed_bfloat16` model
trains to the weights an AVX2-only CPU gives (docs/measurements.md,
"bfloat16 on an AVX-512 CPU"). Nothing else of the CPU changes: oneDNN and Eigen still read CPUID themselves (oneDNN is capped
by `ONEDNN_MAX_CPU_ISA`). With `cpu_isa="ALL"` or off x86-64, it does
nothing. `enable()` caps the view the same way when this patch is left out
(`patches=None`), since the cap is not a cap without it.
"""

from __future__ import annotations

from typing import Any

from tfdet._patching._registry import Patch
from tfdet._pin import _cpu_features, _isa


def _apply(swap: Any) -> None:
    # No cap in force: TensorFlow keeps every extension ("ALL" hides none).
    swap.attribute(_cpu_features.VIEW, "cap", _isa.current_cap() or "ALL")


PATCH = Patch(
    summary="TensorFlow's CPU extension checks (CPUID) -> capped at "
    "ONEDNN_MAX_CPU_ISA, so it never sends an op to a oneDNN kernel the cap "
    "forbids (bfloat16 ops on AVX-512 CPUs)",
    upstream="https://github.com/tensorflow/tensorflow/blob/v2.21.0/tensorflow/core/util/util.cc",
    apply=_apply,
    unavailable=_cpu_features.unavailable,
)
