"""What `tfdet cost` found: one typed record, its JSON and its text."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._cost._settings import Setting

# A setting that ties the bits to this machine is worth naming only when it
# is at least this much faster than the best portable one.
WORTH_TYING = 1.10
# Ops listed per setting: those whose time per step grew most.
GROWING_OPS = 5


@dataclasses.dataclass(frozen=True)
class OpGrowth:
    """One op type's time per step under plain TensorFlow and a setting.

    Attributes:
        op: The op type (oneDNN's kernels by the op they stand in for).
        plain_ms: Its share of plain TensorFlow's step, in ms (0: not run
            there).
        ms: Its share of the setting's step, in ms (0: not run there).
        node: The setting's costliest node of this type (a layer's path).
    """

    op: str
    plain_ms: float
    ms: float
    node: str

    @property
    def grew_ms(self) -> float:
        return self.ms - self.plain_ms


@dataclasses.dataclass(frozen=True)
class CostRow:
    """One setting's figures.

    Attributes:
        setting: What ran.
        ms_per_step: Median over blocks of its median step time.
        ratio: Median over blocks of its step time over plain TensorFlow's in
            the same block (so a shared machine's load cancels).
        ratio_q1, ratio_q3: The middle half of those block ratios.
        xla: Whether Keras trained it with XLA.
        bits_follow: The machine facts its profile leaves to decide the bits
            (`_settings.bits_follow`); empty: portable.
        digests: Its weights' digest, one per round (a fresh process each);
            empty when `same_bits_unknown` says why they cannot tell.
        ops: `{op type: {"ms": its share of a step, "node": costliest
            node}}` from the profiler (`_measure._shares`); empty when the
            profiler saw no op (XLA compiles the step into one program).
        note: Why it is not what was asked (XLA turned off), or None.
        same_bits_unknown: Why the rounds cannot say whether it repeated
            its bits (a script whose processes trained different step
            counts), or None.
    """

    setting: Setting
    ms_per_step: float
    ratio: float
    ratio_q1: float
    ratio_q3: float
    xla: bool
    bits_follow: tuple[str, ...]
    digests: tuple[str, ...]
    ops: dict[str, dict[str, Any]]
    note: str | None = None
    same_bits_unknown: str | None = None

    @property
    def portable(self) -> bool:
        return not self.bits_follow

    @property
    def repeatable(self) -> bool | None:
        """Same digest in every round; None with one round (not compared),
        or when `same_bits_unknown` says why the rounds cannot tell."""
        return None if len(self.digests) < 2 else len(set(self.digests)) == 1

    def growth(self, plain: CostRow) -> list[OpGrowth]:
        """The op types whose time per step grew most over `plain`'s."""
        if not self.ops:
            return []
        found = [
            OpGrowth(
                op,
                float(plain.ops.get(op, {}).get("ms", 0.0)),
                float(self.ops.get(op, {}).get("ms", 0.0)),
                str(self.ops.get(op, plain.ops.get(op, {})).get("node", "")),
            )
            for op in set(self.ops) | set(plain.ops)
        ]
        found.sort(key=lambda growth: -growth.grew_ms)
        return [growth for growth in found[:GROWING_OPS] if growth.grew_ms > 0]

    def to_dict(self, plain: CostRow) -> dict[str, Any]:
        data = {
            "setting": self.setting.to_dict(),
            **{
                field.name: getattr(self, field.name)
                for field in dataclasses.fields(self)
                if field.name != "setting"
            },
        }
        data["bits_follow"] = list(self.bits_follow)
        data["digests"] = list(self.digests)
        data["portable"] = self.portable
        data["repeatable"] = self.repeatable
        data["growing_ops"] = [
            {**dataclasses.asdict(growth), "grew_ms": growth.grew_ms}
            for growth in self.growth(plain)
        ]
        return data


@dataclasses.dataclass(frozen=True)
class CostReport:
    """`tfdet cost`'s result: every setting's figures on one TARGET.

    Attributes:
        target: The TARGET trained.
        cores: CPUs the processes could use.
        cpu_model: This machine's CPU.
        rounds, blocks, steps, warmup: The schedule (`_measure.measure`).
        rows: Plain TensorFlow first, then each tfdet setting.
    """

    target: str
    cores: int
    cpu_model: str
    rounds: int
    blocks: int
    steps: int
    warmup: int
    rows: tuple[CostRow, ...]

    @property
    def plain(self) -> CostRow:
        return self.rows[0]

    def candidates(self) -> list[CostRow]:
        """The tfdet settings that ran as asked."""
        return [row for row in self.rows[1:] if row.note is None]

    def recommended(self) -> CostRow | None:
        """The fastest setting whose bits this machine does not decide.

        The default profile (`enable()`, the first tfdet setting) is kept
        when the fastest one is within its spread: the middle halves of
        their block ratios overlap, so the difference is the machine's noise.
        """
        portable = [row for row in self.candidates() if row.portable]
        fastest = min(portable, key=lambda row: row.ratio, default=None)
        default = self.rows[1] if len(self.rows) > 1 else None
        if (
            fastest is not None
            and default in portable
            and default.ratio_q1 <= fastest.ratio_q3
        ):
            return default
        return fastest

    def recommendation(self) -> str:
        """One sentence: what to use, and what a faster setting would trade."""
        best = self.recommended()
        if best is None:
            return (
                "No tfdet setting ran with bits that are free of this machine; "
                "see the notes above."
            )
        sentence = (
            f"Use tfdet.{best.setting.name}: {best.ratio:.2f}x plain TensorFlow "
            "here, with bits that do not depend on this machine's core count or "
            "instruction set"
        )
        tied = [row for row in self.candidates() if not row.portable]
        faster = min(tied, key=lambda row: row.ratio, default=None)
        if faster is not None and faster.ratio * WORTH_TYING <= best.ratio:
            sentence += (
                f"; tfdet.{faster.setting.name} is {faster.ratio:.2f}x but ties the "
                f"bits to {' and '.join(faster.bits_follow)}: only for runs that "
                "all use this machine's cores"
            )
        return sentence + "."

    def to_dict(self) -> dict[str, Any]:
        best = self.recommended()
        return {
            "target": self.target,
            "cores": self.cores,
            "cpu_model": self.cpu_model,
            "rounds": self.rounds,
            "blocks": self.blocks,
            "steps": self.steps,
            "warmup": self.warmup,
            "rows": [row.to_dict(self.plain) for row in self.rows],
            "recommended": None if best is None else best.setting.name,
            "recommendation": self.recommendation(),
        }

    def __str__(self) -> str:
        return format_text(self)


def _portability(row: CostRow) -> str:
    return "portable" if row.portable else "follow " + ", ".join(row.bits_follow)


def _same_bits(row: CostRow) -> str:
    if row.same_bits_unknown is not None:
        return "unknown"
    if row.repeatable is None:
        return "-"
    return ("yes" if row.repeatable else "NO") + f" ({len(row.digests)})"


def format_text(report: CostReport) -> str:
    """The report as a person reads it: the table, the ops, the advice."""
    blocks = report.rounds * report.blocks
    width = max(len(row.setting.name) for row in report.rows) + 2
    lines = [
        f"tfdet cost {report.target}: {report.cores} cores ({report.cpu_model}); "
        f"{blocks} interleaved blocks of {report.steps} steps in {report.rounds} "
        f"round(s) of fresh processes, after {report.warmup} warm-up steps",
        "",
        f"{'setting':<{width}}{'ms/step':>9}{'ratio':>7}  {'middle half':<11}  "
        f"{'XLA':<4}{'same bits':<10}  bits",
    ]
    for row in report.rows:
        lines.append(
            f"{row.setting.name:<{width}}{row.ms_per_step:>9.2f}{row.ratio:>7.2f}  "
            f"{row.ratio_q1:.2f}-{row.ratio_q3:.2f}{'':<2}  "
            f"{'on' if row.xla else 'off':<4}{_same_bits(row):<10}  "
            f"{_portability(row)}"
        )
    notes = [f"  {row.setting.name}: {row.note}" for row in report.rows if row.note]
    notes += [
        f"  {row.setting.name}: same bits unknown: {row.same_bits_unknown}"
        for row in report.rows
        if row.same_bits_unknown is not None
    ]
    if notes:
        lines += ["", "notes:", *notes]
    best = report.recommended()
    shown = [row for row in report.candidates() if row is best or row is report.rows[1]]
    for row in shown:
        growth = row.growth(report.plain)
        lines += ["", f"ops whose time grew most under {row.setting.name} (ms/step):"]
        if not row.ops:
            lines.append("  none measured (XLA compiles the step into one program)")
        for item in growth:
            lines.append(
                f"  {item.op:<32}{item.plain_ms:>8.2f} -> {item.ms:>7.2f}  "
                f"(+{item.grew_ms:.2f})  {item.node}"
            )
        if row.ops and not growth:
            lines.append("  none grew")
    lines += ["", report.recommendation()]
    return "\n".join(lines)
