"""What `tfdet cost` found: one typed record, its JSON and its text."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdet._cost import _advice
from tfdet._cost._timed_settings import Setting, written
from tfdet._pin import _tiers

# What `tfdet cost` advises for unless told (`--need`): on the CPU, the bits
# of any x86 CPU with any core count, what the default `enable()` gives; on
# a GPU, the same GPU's (the widest tier a GPU run gives).
DEFAULT_NEED = (_tiers.ANY_X86_CPU.name,)
DEFAULT_GPU_NEED = (_tiers.SAME_GPU.name,)


def device_tiers(device: str) -> tuple[_tiers.Tier, ...]:
    """The tiers a run on `device` ("cpu" or "gpu") can give."""
    return _tiers.CPU_TIERS if device == "cpu" else (_tiers.SAME_GPU,)


def default_need(device: str) -> tuple[str, ...]:
    """What the advice is for on `device` unless told."""
    return DEFAULT_NEED if device == "cpu" else DEFAULT_GPU_NEED


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
        tiers: The tiers its profile gives (`_settings.tiers`), by name.
        digests: Its weights' digest, one per round (a fresh process each);
            empty when `same_bits_unknown` says why they cannot tell.
        ops: `{op type: {"ms": its share of a step, "node": costliest
            node}}` from the profiler (`_measure._shares`); empty when the
            profiler saw no op (XLA compiles the step into one program).
        note: Why it is not what was asked (XLA turned off, tfdet's kernels
            not loaded: `_timed_settings.not_as_asked`), or None.
        same_bits_unknown: Why the rounds cannot say whether it repeated
            its bits (a script whose processes trained different step
            counts), or None.
        peak_mb: The largest peak resident memory of its processes (MB,
            from their start to the last timed block), or None where the
            child did not say (a tfdet older than the field).
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
    tiers: tuple[str, ...] = ()
    same_bits_unknown: str | None = None
    peak_mb: float | None = None

    @property
    def name(self) -> str:
        return self.setting.name

    @property
    def portable(self) -> bool:
        return not self.bits_follow

    @property
    def gives(self) -> tuple[str, ...]:
        """The tiers it gives: its profile's, none if its bits did not repeat
        in fresh processes (then the profile did not hold them)."""
        return () if self.repeatable is False else self.tiers

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
        data["tiers"] = list(self.tiers)
        data["gives"] = list(self.gives)
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
        rounds, blocks, steps, warmup: The schedule (`_measure.measure`);
            `blocks` per round, as asked.
        rows: Plain TensorFlow first, then each tfdet setting.
        per_block: Per block timed (all rounds, and the blocks run beyond
            the schedule while the advice was inconclusive), each setting's
            median ms/step: what the advice compares.
        need: The tier names the advice is for (`tfdet._pin._tiers`).
        device: Where the runs trained: "cpu" or "gpu".
        device_name: The GPU's name (None on the CPU).
    """

    target: str
    cores: int
    cpu_model: str
    rounds: int
    blocks: int
    steps: int
    warmup: int
    rows: tuple[CostRow, ...]
    per_block: tuple[dict[str, float], ...] = ()
    need: tuple[str, ...] = DEFAULT_NEED
    device: str = "cpu"
    device_name: str | None = None

    @property
    def plain(self) -> CostRow:
        return self.rows[0]

    def candidates(self) -> list[CostRow]:
        """The tfdet settings that ran as asked."""
        return [row for row in self.rows[1:] if row.note is None]

    def advice(self, need: tuple[str, ...] | None = None) -> _advice.Advice:
        """The advice for `need` (default: the report's), `_advice.advise`."""
        return _advice.advise(self.rows, self.per_block, need or self.need)

    def recommended(self) -> CostRow | None:
        """The setting advised for the report's need, or None when none
        gives it or the blocks could not tell the candidates apart."""
        advice = self.advice()
        if advice.verdict not in (_advice.FIRM, _advice.TIE):
            return None
        return next(row for row in self.rows if row.name == advice.setting)

    def recommendation(self) -> str:
        """One sentence: what to use for the need, and what a cheaper
        setting that gives less would trade."""
        advice = self.advice()
        sentence = _advice.sentence(advice, self.rounds)
        if advice.verdict not in (_advice.FIRM, _advice.TIE):
            return sentence
        others = [row for row in self.candidates() if row.name != advice.setting]
        cheaper = min(others, key=lambda row: row.ratio, default=None)
        if (
            cheaper is not None
            and advice.ratio is not None
            and cheaper.ratio * _advice.WORTH_LEAVING <= advice.ratio
        ):
            lacks = [
                _tiers.TIERS[name].label
                for name in advice.need
                if name not in cheaper.gives
            ]
            sentence = sentence[:-1] + (
                f"; {written(cheaper.name)} is {cheaper.ratio:.2f}x but does not give "
                f"{' or '.join(lacks)}"
                + (
                    f" (its bits follow {', '.join(cheaper.bits_follow)})"
                    if cheaper.bits_follow
                    else ""
                )
                + "."
            )
        return sentence

    def to_dict(self) -> dict[str, Any]:
        best = self.recommended()
        return {
            "target": self.target,
            "cores": self.cores,
            "cpu_model": self.cpu_model,
            "device": self.device,
            "device_name": self.device_name,
            "rounds": self.rounds,
            "blocks": self.blocks,
            "blocks_timed": len(self.per_block),
            "steps": self.steps,
            "warmup": self.warmup,
            "rows": [row.to_dict(self.plain) for row in self.rows],
            "per_block_ms": [dict(block) for block in self.per_block],
            "need": list(self.need),
            "advice": self.advice().to_dict(),
            "advice_per_tier": {
                tier.name: self.advice((tier.name,)).to_dict()
                for tier in device_tiers(self.device)
            },
            "recommended": None if best is None else best.setting.name,
            "recommendation": self.recommendation(),
        }

    def __str__(self) -> str:
        return format_text(self)


# The tiers of a CPU run that build on each other (each includes the one
# before); any batch stands beside them.
_LADDER = (_tiers.THIS_MACHINE, _tiers.ANY_THREAD_COUNT, _tiers.ANY_X86_CPU)


def _gives(row: CostRow) -> str:
    """The widest tier of the ladder it reaches, any batch beside (or the
    same GPU), and what its bits follow."""
    if not row.gives:
        why = "bits did not repeat" if row.repeatable is False else "no op determinism"
        return f"none ({why})"
    reached = [tier.label for tier in _LADDER if tier.name in row.gives][-1:]
    reached += [
        tier.label
        for tier in (_tiers.ANY_BATCH, _tiers.SAME_GPU)
        if tier.name in row.gives
    ]
    text = ", ".join(reached)
    if row.bits_follow:
        text += f" (bits follow {', '.join(row.bits_follow)})"
    return text


def _advice_line(report: CostReport, tier: _tiers.Tier) -> str:
    advice = report.advice((tier.name,))
    head = f"  {tier.label:<18}"
    if advice.verdict == _advice.NONE:
        return head + "no setting gives it"
    if advice.verdict == _advice.INCONCLUSIVE:
        return (
            head + f"inconclusive: {advice.rival} {advice.rival_ratio:.2f}x or "
            f"{advice.setting} {advice.ratio:.2f}x (the first faster in "
            f"{advice.faster_blocks} of {advice.blocks} blocks)"
        )
    return head + f"{advice.setting} {advice.ratio:.2f}x"


def _same_bits(row: CostRow) -> str:
    if row.same_bits_unknown is not None:
        return "unknown"
    if row.repeatable is None:
        return "-"
    return ("yes" if row.repeatable else "NO") + f" ({len(row.digests)})"


def _peak(row: CostRow, plain: CostRow) -> str:
    """Peak memory and its ratio to plain TensorFlow's, 15 columns."""
    if row.peak_mb is None:
        return f"{'-':>8}{'-':>7}"
    ratio = f"{row.peak_mb / plain.peak_mb:.2f}" if plain.peak_mb else "-"
    return f"{row.peak_mb:>8.0f}{ratio:>7}"


def format_text(report: CostReport) -> str:
    """The report as a person reads it: the table, the ops, the advice."""
    blocks = len(report.per_block) or report.rounds * report.blocks
    extra = blocks - report.rounds * report.blocks
    more = f" (+{extra} while the advice was inconclusive)" if extra > 0 else ""
    width = max(len(row.setting.name) for row in report.rows) + 2
    where = f"{report.cores} cores ({report.cpu_model})"
    if report.device == "gpu":
        where = f"GPU {report.device_name}, host {where}"
    lines = [
        f"tfdet cost {report.target}: {where}; "
        f"{blocks} interleaved blocks{more} of {report.steps} steps in "
        f"{report.rounds} round(s) of fresh processes, after {report.warmup} "
        "warm-up steps",
        "",
        f"{'setting':<{width}}{'ms/step':>9}{'ratio':>7}  {'middle half':<11}  "
        f"{'peak MB':>8}{'ratio':>7}  {'XLA':<4}{'same bits':<10}  same bits on",
    ]
    for row in report.rows:
        lines.append(
            f"{row.setting.name:<{width}}{row.ms_per_step:>9.2f}{row.ratio:>7.2f}  "
            f"{row.ratio_q1:.2f}-{row.ratio_q3:.2f}{'':<2}  "
            f"{_peak(row, report.plain)}  "
            f"{'on' if row.xla else 'off':<4}{_same_bits(row):<10}  "
            f"{_gives(row)}"
        )
    notes = [f"  {row.setting.name}: {row.note}" for row in report.rows if row.note]
    notes += [
        f"  {row.setting.name}: same bits unknown: {row.same_bits_unknown}"
        for row in report.rows
        if row.same_bits_unknown is not None
    ]
    if notes:
        lines += ["", "notes:", *notes]
    advice = report.advice()
    shown = [
        row
        for row in report.candidates()
        if row.name in (advice.setting, advice.rival) or row is report.rows[1]
    ]
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
    lines += ["", "advice per tier (--need picks the one below):"]
    lines += [_advice_line(report, tier) for tier in device_tiers(report.device)]
    lines += ["", report.recommendation()]
    return "\n".join(lines)
