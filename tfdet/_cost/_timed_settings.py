"""The settings `tfdet cost` times, and what each one's profile ties the bits to."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._pin import _tiers
from tfdet._pin._tiers import POOL_SIZE_FREE


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
    """Plain TensorFlow (the baseline, first) and each tfdet setting a user
    would try on a machine whose process may use `cores` CPUs, one per tier
    of guarantee (`tfdet._pin._tiers`), cheapest way to each first:

    - `enable()`: one thread, AVX2 (any x86 CPU);
    - `enable(threads=N)`: the cores, AVX2 (bits follow N threads);
    - `enable(threads=N, cpu_isa=None)`: the cores and the CPU's best
      instructions, op determinism and seeds (this machine only);
    - the pool-size-free products at N threads (any x86 CPU, any batch);
    - XLA (`xla=False` leaves it out: a script compiles its own models).

    With one core, `threads=N` is `enable()` itself and is left out.
    """
    threads = {"threads": cores} if cores > 1 else {}

    def call(**arguments: str) -> str:
        shown = {**{k: str(v) for k, v in threads.items()}, **arguments}
        return f"enable({', '.join(f'{k}={v}' for k, v in shown.items())})"

    found = [PLAIN, Setting("enable()", {})]
    if cores > 1:
        found.append(Setting(call(), dict(threads)))
    found.append(Setting(call(cpu_isa="None"), {**threads, "cpu_isa": None}))
    found.append(
        Setting(
            call(patches=f'["auto", "{POOL_SIZE_FREE}"]'),
            {**threads, "patches": ["auto", POOL_SIZE_FREE]},
        )
    )
    if xla:
        # Whether the model compiles (and Keras keeps XLA under op
        # determinism) is known only once it is built: the run says so.
        found.append(Setting("enable() + jit_compile=True", {}, jit_compile=True))
    return found


def bits_follow(profile: dict[str, Any], xla: bool) -> list[str]:
    """The machine facts that decide a run's bits because its profile leaves
    them free: the ones a faster setting trades (the tiers it does not
    reach, `tfdet._pin._tiers`, in words). Empty: the same bits on any
    machine that conforms to the profile.

    Args:
        profile: A run's `tfdet.Profile`, as `Profile.to_dict()` gives it.
        xla: Whether the run trained with XLA (whose CPU code has its own
            instruction-set cap).
    """
    tied = []
    threads = profile["intra_op_threads"]
    if _tiers.follows_threads(profile):
        tied.append("the core count" if threads == 0 else f"{threads} threads")
    if _tiers.follows_isa(profile, xla):
        xla_only = profile["cpu_isa"] not in ("ALL", "not applicable")
        tied.append("the CPU's instruction set" + (" (XLA:CPU)" if xla_only else ""))
    return tied


def tiers(profile: dict[str, Any], xla: bool) -> list[str]:
    """The tiers a run's profile gives, by name (`tfdet._pin._tiers.given`)."""
    return [tier.name for tier in _tiers.given(profile, xla)]
