"""`tfdet cost`'s advice: per tier, the setting to use, and how sure the blocks are.

For a need (one or more tiers, `tfdet._pin._tiers`), the candidates are the
tfdet settings that ran as asked and whose profile gives every tier needed.
The *preferred* one is the first of them in the report's order (the
default `enable()` where it qualifies: the setting with the fewest
surprises); the *cheapest* is the one with the lowest ratio to plain
TensorFlow. The cheapest is advised unless:

- its median ratio is within `WORTH_LEAVING` of the preferred one's: a tie,
  and the preferred one is advised (the saving is too small to leave it);
- the blocks cannot tell the two apart: the verdict is *inconclusive* (and
  `tfdet cost` first runs more blocks, up to a bound, while that is so).

"Tell apart" is a sign test on the blocks, which interleave the settings so
that each block compares times taken seconds apart: the cheapest must be
faster than the preferred one in so many blocks that a coin tossed per
block would do as well less than `SIGNIFICANCE` of the time. A block that
a neighbour's load slowed for one setting counts as one block, however
slow, so one noisy block cannot make the advice, nor (as comparing middle
halves did) keep a setting twice as fast from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

from tfdet._cost._timed_settings import written
from tfdet._pin import _tiers

# A setting must be this much cheaper than the preferred one to be advised
# over it: below, the saving is within what a machine's load moves.
WORTH_LEAVING = 1.10
# The sign test's level: the chance that a coin per block shows the cheapest
# setting faster in as many blocks.
SIGNIFICANCE = 0.10
# While inconclusive, `tfdet cost` runs up to this many times the blocks
# asked (all rounds together) before it says so.
MAX_BLOCKS_FACTOR = 2

FIRM = "firm"
TIE = "tie"
INCONCLUSIVE = "inconclusive"
NONE = "none"


class Row(Protocol):
    """What the advice reads of a report's row (`_cost_report.CostRow`)."""

    @property
    def name(self) -> str: ...

    @property
    def ratio(self) -> float: ...

    @property
    def gives(self) -> tuple[str, ...]: ...

    @property
    def note(self) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class Advice:
    """The advice for one need.

    Attributes:
        need: The tier names every candidate had to give.
        verdict: `FIRM` (use `setting`), `TIE` (`setting` is the preferred
            one, `rival` within `WORTH_LEAVING` of it), `INCONCLUSIVE`
            (`rival`, the cheapest, and `setting`, the preferred one, could
            not be told apart), `NONE` (no setting gives the need).
        setting: The setting advised (the preferred one when inconclusive);
            None with `NONE`.
        ratio: Its ratio to plain TensorFlow.
        rival: The other setting weighed against it, or None.
        rival_ratio: The rival's ratio.
        faster_blocks: Blocks in which the cheapest was faster than the
            preferred one (0 when they are one setting, or a tie).
        blocks: Blocks timed.
    """

    need: tuple[str, ...]
    verdict: str
    setting: str | None = None
    ratio: float | None = None
    rival: str | None = None
    rival_ratio: float | None = None
    faster_blocks: int = 0
    blocks: int = 0

    @property
    def gate_ratio(self) -> float | None:
        """The ratio a `--max-ratio` gate compares: the advised setting's, or
        when inconclusive the cheaper of the two (the gate fires only when
        even that one is above it)."""
        if (
            self.verdict == INCONCLUSIVE
            and self.ratio is not None
            and self.rival_ratio is not None
        ):
            return min(self.ratio, self.rival_ratio)
        return self.ratio

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "need": list(self.need)}


def faster_blocks(per_block: Sequence[dict[str, float]], fast: str, slow: str) -> int:
    """Blocks in which `fast` took less time per step than `slow`."""
    return sum(block[fast] < block[slow] for block in per_block)


def separated(faster: int, blocks: int) -> bool:
    """Whether `faster` of `blocks` is more than chance: the one-sided sign
    test's p-value (a fair coin per block showing at least `faster`) is
    below `SIGNIFICANCE`. Four blocks need four; eight, seven."""
    tail = sum(math.comb(blocks, k) for k in range(faster, blocks + 1))
    return blocks > 0 and tail / 2**blocks < SIGNIFICANCE


def advise(
    rows: Sequence[Row], per_block: Sequence[dict[str, float]], need: Sequence[str]
) -> Advice:
    """The advice for `need` among `rows` (plain TensorFlow first, then the
    tfdet settings in the order the preferred one comes first), from the
    per-block median ms/step of each setting (`per_block`)."""
    need = tuple(need)
    candidates = [
        row
        for row in rows[1:]
        if row.note is None and all(tier in row.gives for tier in need)
    ]
    if not candidates:
        return Advice(need, NONE)
    preferred = candidates[0]
    cheapest = min(candidates, key=lambda row: row.ratio)
    if cheapest is preferred:
        return Advice(
            need, FIRM, preferred.name, preferred.ratio, blocks=len(per_block)
        )
    if preferred.ratio <= cheapest.ratio * WORTH_LEAVING:
        return Advice(
            need, TIE, preferred.name, preferred.ratio, cheapest.name, cheapest.ratio
        )
    faster = faster_blocks(per_block, cheapest.name, preferred.name)
    if separated(faster, len(per_block)):
        verdict, advised, rival = FIRM, cheapest, preferred
    else:
        verdict, advised, rival = INCONCLUSIVE, preferred, cheapest
    return Advice(
        need,
        verdict,
        advised.name,
        advised.ratio,
        rival.name,
        rival.ratio,
        faster,
        len(per_block),
    )


def check_max_ratio(value: Any, name: str = "`max_ratio`") -> float:
    """A `--max-ratio` gate: a finite number > 0; ValueError (naming the
    option as `name`) otherwise."""
    try:
        if isinstance(value, bool):
            raise TypeError
        ratio = float(value)
    except (TypeError, ValueError):
        ratio = math.nan
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(
            f"Expected {name} to be a finite number > 0. Received: {value!r}"
        )
    return ratio


def over_gate(advice: Advice, max_ratio: float) -> str | None:
    """Why `advice` fails a `max_ratio` gate, or None when it passes: the
    advised setting costs more (inconclusive: even the cheaper of the two
    does), or no setting gives the need."""
    labels = " + ".join(_tiers.TIERS[name].label for name in advice.need)
    if advice.verdict == NONE:
        return f"no tfdet setting gave {labels}, so none is within --max-ratio"
    gate = advice.gate_ratio
    if gate is not None and gate > max_ratio:
        which = (
            "the cheaper of the two" if advice.verdict == INCONCLUSIVE else "advised"
        )
        return (
            f"the setting {which} for {labels} costs {gate:.2f}x "
            f"plain TensorFlow, above --max-ratio {max_ratio:g}"
        )
    return None


def undecided(advice: Advice) -> bool:
    """Whether more blocks could decide `advice` (it is inconclusive)."""
    return advice.verdict == INCONCLUSIVE


def blocks_bound(blocks_asked: int) -> int:
    """The most blocks `tfdet cost` runs (all rounds) while inconclusive."""
    return MAX_BLOCKS_FACTOR * blocks_asked


def sentence(advice: Advice, rounds: int = 1) -> str:
    """The advice as one sentence (`rounds`: of the report, for the
    `--blocks` an inconclusive one suggests)."""
    labels = " + ".join(_tiers.TIERS[name].label for name in advice.need)
    if advice.verdict == NONE:
        return (
            f"For {labels}: no tfdet setting here gave it (see the bits and the "
            "notes above)."
        )
    # Every verdict but NONE names a setting (and INCONCLUSIVE, TIE a rival).
    setting, rival = written(advice.setting or ""), written(advice.rival or "")
    if advice.verdict == INCONCLUSIVE:
        return (
            f"For {labels}: inconclusive: {rival} ({advice.rival_ratio:.2f}x "
            f"plain TensorFlow) and {setting} ({advice.ratio:.2f}x) "
            f"could not be told apart (the first faster in {advice.faster_blocks} of "
            f"{advice.blocks} blocks): rerun with --blocks "
            f"{math.ceil(2 * advice.blocks / rounds)} on a "
            "quieter machine."
        )
    text = f"For {labels}: use {setting}: {advice.ratio:.2f}x plain TensorFlow here"
    if advice.verdict == TIE:
        text += (
            f" ({rival}, {advice.rival_ratio:.2f}x, is within "
            f"{WORTH_LEAVING - 1:.0%}: not worth leaving it)"
        )
    elif advice.rival is not None:
        text += (
            f", faster than {rival} ({advice.rival_ratio:.2f}x) in "
            f"{advice.faster_blocks} of {advice.blocks} blocks"
        )
    return text + "."
