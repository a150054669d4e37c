"""The settings `tfdet cost` times, and what each one's profile ties the bits to."""

from __future__ import annotations

import dataclasses
from typing import Any

# The opt-in patch whose products do not follow the thread-pool size.
POOL_SIZE_FREE = "pool_size_free_products"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One way of training the TARGET, in a process of its own.

    Attributes:
        name: How the report names it: the call a user would write.
        enable: `tfdet.enable()` keyword arguments, or None for plain
            TensorFlow (Keras's own seeding only: what a careful user does).
        jit_compile: Set on the model before its first step (XLA), or None
            to keep what the TARGET compiled with.
    """

    name: str
    enable: dict[str, Any] | None
    jit_compile: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Setting:
        return cls(**data)


PLAIN = Setting("plain TensorFlow", None)


def settings_for(cores: int, xla: bool = True) -> list[Setting]:
    """Plain TensorFlow (the baseline, first) and each tfdet setting that
    applies on a machine whose process may use `cores` CPUs.

    With one core, more threads and the pool-size-free products (whose point
    is the same bits at any thread count) have nothing to add. `xla=False`
    leaves XLA out (a script compiles its own models).
    """
    found = [PLAIN, Setting("enable()", {})]
    if cores > 1:
        found.append(Setting(f"enable(threads={cores})", {"threads": cores}))
        found.append(
            Setting(
                f'enable(threads={cores}, patches=["auto", "{POOL_SIZE_FREE}"])',
                {"threads": cores, "patches": ["auto", POOL_SIZE_FREE]},
            )
        )
    if xla:
        # Whether the model compiles (and Keras keeps XLA under op
        # determinism) is known only once it is built: the run says so.
        found.append(Setting("enable() + jit_compile=True", {}, jit_compile=True))
    return found


def bits_follow(profile: dict[str, Any], xla: bool) -> list[str]:
    """The machine facts that decide a run's bits because its profile leaves
    them free: the ones a faster setting trades. Empty: the same bits on any
    machine that conforms to the profile.

    Args:
        profile: A run's `tfdet.Profile`, as `Profile.to_dict()` gives it.
        xla: Whether the run trained with XLA (whose CPU code has its own
            instruction-set cap).
    """
    tied = []
    threads = profile["intra_op_threads"]
    if threads != 1 and POOL_SIZE_FREE not in profile["patches"]:
        tied.append("the core count" if threads == 0 else f"{threads} threads")
    if profile["cpu_isa"] == "ALL":
        tied.append("the CPU's instruction set")
    elif xla and str(profile.get("xla_cpu_isa")).startswith("none"):
        tied.append("the CPU's instruction set (XLA:CPU)")
    return tied
