"""The settings `tfdet cost` times, and what each one's profile ties the bits to."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._patching import _registry
from tfdet._pin import _tiers
from tfdet._setup import _coverage


@dataclasses.dataclass(frozen=True)
class Setting:
    """One way of training the TARGET, in a process of its own.

    Attributes:
        name: How the report names it: the call a user would write.
        enable: `tfdet.enable()` keyword arguments, or None for plain
            TensorFlow (Keras's own seeding only: what a careful user does).
        jit_compile: Set on the model before its first step (XLA), or None
            to keep what the TARGET compiled with.
        op_determinism: Without tfdet (`enable` None), also turn on
            TensorFlow's own op determinism as its guide says (seeds and
            `tf.config.experimental.enable_op_determinism()`).
    """

    name: str
    enable: dict[str, Any] | None
    jit_compile: bool | None = None
    op_determinism: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Setting:
        return cls(**data)


PLAIN = Setting("plain TensorFlow", None)
# TensorFlow's own answer, without tfdet: what a GPU user tries first.
OP_DETERMINISM = Setting("seeds + enable_op_determinism()", None, op_determinism=True)
DEVICES = ("cpu", "gpu")


def written(name: str) -> str:
    """How a sentence writes the setting `name`: tfdet's as a call of the
    package (`tfdet.enable(...)`), TensorFlow's own as named."""
    return name if name in (PLAIN.name, OP_DETERMINISM.name) else f"tfdet.{name}"


# The default on one thread: the same bits (what the pool buys).
ONE_THREAD = Setting("enable(threads=1)", {"threads": 1})
# oneDNN's ops on the CPU's best instructions: bits that follow the CPU.
UNCAPPED = Setting("enable(cpu_isa=None)", {"cpu_isa": None})


# Whether the model compiles (and Keras keeps XLA under op determinism) is
# known only once it is built: the run says so.
XLA = Setting("enable() + jit_compile=True", {}, jit_compile=True)


# The patches whose ops are tfdet's own kernels (installed with tfdet, or
# compiled at first use): beside the pool-size-free products, a model's
# products and convolutions (and their gradients) are one op each, and the
# exact GELU's erfc one op whose exp runs on whole packets, as the
# composition's does.
KERNEL_PATCHES = (
    "fixed_order_products",
    "fixed_order_convolutions",
    "portable_kernels",
)


def kernel_patches() -> tuple[str, ...]:
    """Those of `KERNEL_PATCHES` with ops to compute on this TensorFlow (the
    GELU's kernel has none before 2.20, whose own Erfc is portable)."""
    patches = _registry.available()
    return tuple(name for name in KERNEL_PATCHES if patches[name].needed())


def settings_for(cores: int, xla: bool = True) -> list[Setting]:
    """Plain TensorFlow (the baseline, first) and each tfdet setting a user
    would try on a machine whose process may use `cores` CPUs:

    - `enable()`: the default, every CPU tier (`tfdet._pin._tiers`): pools
      of the `cores`, tfdet's kernels where they load (the compositions
      where they do not: the profile's `kernels` says which), AVX2 for what
      oneDNN still computes;
    - `enable(threads=1)`: the same bits on one thread (what the pool buys;
      left out with one core, where it is `enable()` itself);
    - `enable(cpu_isa=None)`: oneDNN's ops on the CPU's best instructions
      (its bits follow the CPU);
    - XLA (`xla=False` leaves it out: a script compiles its own models).
    """
    found = [PLAIN, Setting("enable()", {})]
    if cores > 1:
        found.append(ONE_THREAD)
    found.append(UNCAPPED)
    if xla:
        found.append(XLA)
    return found


def gpu_settings_for(cores: int, xla: bool = True) -> list[Setting]:
    """The settings a GPU user would try, plain TensorFlow (with XLA where
    Keras turns it on by itself) first:

    - `enable()`: the default profile (the host's cores, tfdet's
      replacements for the ops TensorFlow refuses on a GPU), first of the
      deterministic ones, so the advice prefers it on a tie;
    - TensorFlow's own op determinism and seeds (Keras then turns its
      automatic XLA off; a model with an op TensorFlow refuses on a GPU
      fails this setting's run, and `tfdet cost` with it: exit 3);
    - `enable(threads=1)`: one host thread, which shows the host's share
      (the GPU's bits do not follow it);
    - XLA under its deterministic ops (`xla=False` leaves it out).
    """
    found = [PLAIN, Setting("enable()", {}), OP_DETERMINISM]
    if cores > 1:
        found.append(ONE_THREAD)
    if xla:
        found.append(XLA)
    return found


def bits_follow(
    profile: dict[str, Any],
    xla: bool,
    device: str = "cpu",
    coverage: _coverage.Coverage | None = None,
) -> list[str]:
    """The machine facts that decide a run's bits because its profile leaves
    them free, or its model runs ops the profile does not cover: the ones a
    faster setting trades (the tiers it does not reach, `tfdet._pin._tiers`,
    in words). Empty: the same bits on any machine that conforms to the
    profile.

    Args:
        profile: A run's `tfdet.Profile`, as `Profile.to_dict()` gives it.
        xla: Whether the run trained with XLA (whose CPU code has its own
            instruction-set cap).
        device: "cpu" or "gpu": where the run trained.
        coverage: What the run's model ran that the profile does not cover
            (`tfdet._setup._coverage`).
    """
    if device == "gpu":  # No GPU run was measured to repeat on another one.
        return ["the GPU model and its software"]
    uncovered = () if coverage is None else coverage.uncovered

    def through(what: str) -> str:
        return ", ".join(op.op for op in uncovered if what in op.follows)

    tied = []
    threads = profile["intra_op_threads"]
    if _tiers.follows_threads(profile):
        tied.append("the core count" if threads == 0 else f"{threads} threads")
    elif through(_coverage.POOL):
        tied.append(f"{threads} threads (through {through(_coverage.POOL)})")
    if _tiers.follows_isa(profile, xla):
        xla_only = profile["cpu_isa"] not in ("ALL", "not applicable")
        tied.append("the CPU's instruction set" + (" (XLA:CPU)" if xla_only else ""))
    elif through(_coverage.CPU_MODEL):
        tied.append(f"the CPU model (through {through(_coverage.CPU_MODEL)})")
    return tied


def tiers(
    profile: dict[str, Any],
    xla: bool,
    device: str = "cpu",
    coverage: _coverage.Coverage | None = None,
) -> list[str]:
    """The tiers a run's profile gives, by name (`tfdet._pin._tiers.given`),
    less those its model's uncovered ops take (`coverage.lost`)."""
    lost = () if coverage is None else coverage.lost
    return [
        tier.name
        for tier in _tiers.given(profile, xla, device)
        if tier.name not in lost
    ]


def not_as_asked(
    setting: Setting, profile: dict[str, Any] | None, xla: bool
) -> str | None:
    """Why a run of `setting` did not train as the setting says, or None.

    Args:
        setting: What was asked.
        profile: The run's profile (`Profile.to_dict()`), None without tfdet.
        xla: Whether Keras trained it with XLA.
    """
    if setting.jit_compile and not xla:
        return (
            "Keras turned jit_compile off (no deterministic XLA path for a "
            "layer under op determinism): timed without XLA"
        )
    if setting.enable is None:
        return None
    # No `patches`: "auto", which installs every kernel these versions need.
    listed = setting.enable.get("patches", kernel_patches())
    asked = [name for name in listed if name in KERNEL_PATCHES]
    ran = set((profile or {}).get("kernels") or ())
    missing = [name for name in asked if name not in ran]
    if missing:
        return (
            f"tfdet's kernels did not load for {', '.join(missing)} (none "
            "shipped for this TensorFlow and machine, no compiler and no cached "
            "build, or a failed build: the run's log says which): timed with "
            "the compositions"
        )
    return None
