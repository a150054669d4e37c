"""The guarantees a profile gives, named once: the tiers.

One vocabulary for what "the same bits" covers, read from a `tfdet.Profile`
(as `Profile.to_dict()` gives it, so that a profile another process reported
reads the same): `tfdet.Profile.tiers()`, `tfdet cost`'s rows and its
`--need`. A tier names where the bits repeat, not how fast:

- *this machine*: the same CPU model and the same thread count (op
  determinism and tfdet's seeds; the default of TensorFlow on a CPU is not
  this: without op determinism an op may pick another algorithm per run);
- *any thread count*: the bits do not follow the thread-pool size, so a
  machine with more or fewer cores gets them too (products that do not
  follow the pool size at any count, or one thread, which every machine
  runs alike);
- *any x86 CPU*: any x86-64 CPU from the profile's instruction-set cap up
  (AVX2 by default: every generation from Haswell on), with any core count
  (so it includes *any thread count*);
- *any batch*: each sample's predictions do not follow what else is in its
  batch (the pool-size-free products; see docs/how-to/batch-invariance.md);
- *the same GPU*: on a GPU, the same GPU model, driver and CUDA/cuDNN
  versions (op determinism, and XLA's deterministic ops where XLA runs).

The predicates here are the only place that decides which tier a profile
reaches; `tfdet cost`'s "bits follow" column reads the same ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The patch whose products follow neither the pool size nor the batch.
POOL_SIZE_FREE = "pool_size_free_products"


@dataclasses.dataclass(frozen=True)
class Tier:
    """One guarantee.

    Attributes:
        name: How commands name it (`tfdet cost --need NAME`).
        label: How reports write it.
        means: One sentence: where the same bits come back.
    """

    name: str
    label: str
    means: str


THIS_MACHINE = Tier(
    "this-machine",
    "this machine",
    "the same CPU model and thread count (reruns here or on identical machines)",
)
ANY_THREAD_COUNT = Tier(
    "any-thread-count",
    "any thread count",
    "bits that do not follow the thread-pool size: machines with any core count",
)
ANY_X86_CPU = Tier(
    "any-x86-cpu",
    "any x86 CPU",
    "any x86-64 CPU from the profile's ISA cap up (AVX2: Haswell on), any core count",
)
ANY_BATCH = Tier(
    "any-batch",
    "any batch",
    "each sample's predictions whatever else is in its batch",
)
SAME_GPU = Tier(
    "same-gpu",
    "the same GPU",
    "the same GPU model, driver and CUDA/cuDNN versions",
)
TIERS = {tier.name: tier for tier in (THIS_MACHINE, ANY_THREAD_COUNT, ANY_X86_CPU)}
TIERS.update({tier.name: tier for tier in (ANY_BATCH, SAME_GPU)})
# The tiers of a CPU run (the others need a GPU).
CPU_TIERS = (THIS_MACHINE, ANY_THREAD_COUNT, ANY_X86_CPU, ANY_BATCH)


def follows_threads(profile: dict[str, Any]) -> bool:
    """Whether the bits follow the thread-pool size (or the core count).

    One thread is the count every machine runs alike; the pool-size-free
    products give the same bits at any count.
    """
    return profile["intra_op_threads"] != 1 and POOL_SIZE_FREE not in profile["patches"]


def follows_isa(profile: dict[str, Any], xla: bool) -> bool:
    """Whether the bits follow the CPU's instruction set: oneDNN uncapped,
    or (for a run that trained with XLA) XLA:CPU uncapped; off x86-64 (no
    cap applies) too, since no other CPU was measured there."""
    cap = str(profile.get("cpu_isa"))
    if cap in ("ALL", "not applicable"):
        return True
    return xla and str(profile.get("xla_cpu_isa")).startswith("none")


def given(
    profile: dict[str, Any], xla: bool = False, device: str = "cpu"
) -> list[Tier]:
    """The tiers `profile` gives, in the vocabulary's order.

    Args:
        profile: A run's `tfdet.Profile`, as `Profile.to_dict()` gives it.
        xla: Whether the run trained with XLA.
        device: "cpu" or "gpu": the device the run trained on.
    """
    if not profile.get("op_determinism"):
        return []
    if device == "gpu":
        if xla and not profile.get("xla_determinism"):
            return []
        return [SAME_GPU]
    found = [THIS_MACHINE]
    if not follows_threads(profile):
        found.append(ANY_THREAD_COUNT)
        if not follows_isa(profile, xla):
            found.append(ANY_X86_CPU)
    # Measured without XLA only: XLA compiles the replacements with the rest.
    if POOL_SIZE_FREE in profile["patches"] and not xla:
        found.append(ANY_BATCH)
    return found


def check_names(
    names: list[str] | tuple[str, ...], allowed: tuple[Tier, ...]
) -> tuple[str, ...]:
    """`names` if each is one of `allowed`'s; ValueError naming them otherwise."""
    known = [tier.name for tier in allowed]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(
            f"Expected tiers from {', '.join(known)}. Received: "
            f"{', '.join(names) or 'none'}"
        )
    return tuple(names)
