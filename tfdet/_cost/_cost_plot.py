"""A picture of `tfdet cost`: each setting's ratio, and the ops that grew.

Left: per setting, its ratio to plain TensorFlow (the bar) with the middle
half of the block ratios (the whisker), coloured by whether it gives the
tiers the report advises for (`--need`). Right: per tfdet setting, the op types whose time per step grew
most over plain TensorFlow. matplotlib is imported only here, with the
non-interactive Agg canvas.
"""

from __future__ import annotations

import os

from tfdet._cost._cost_report import CostReport
from tfdet._pin import _tiers
from tfdet._record._plot import require_matplotlib

_PORTABLE = "#2ca02c"
_TIED = "#ff7f0e"
_PLAIN = "#7f7f7f"


def check_path(path: str | os.PathLike[str]) -> None:
    """Fails before any measurement when `plot_cost` could not write `path`
    in a format its extension names.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: no extension, or one matplotlib does not write.
    """
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = os.path.splitext(os.fspath(path))[1][1:].lower()
    if extension not in formats:
        raise ValueError(
            f"Expected a file name whose extension is a picture format "
            f"({', '.join(sorted(formats))}). Received: {os.fspath(path)!r}"
        )


def plot_cost(report: CostReport, path: str | os.PathLike[str], dpi: int = 120) -> str:
    """Draws `report` and saves it; the extension picks the format.

    Returns:
        `path`, as a string.

    Raises:
        ImportError: matplotlib is not installed (`pip install tfdet[plot]`).
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = list(report.rows)
    figure = Figure(figsize=(13, 1.2 + 0.55 * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    ratios, ops = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1]})
    names = [row.setting.name for row in rows]
    y = list(range(len(rows)))[::-1]
    colours = [
        _PLAIN
        if index == 0
        else (_PORTABLE if set(report.need) <= set(row.gives) else _TIED)
        for index, row in enumerate(rows)
    ]
    ratios.barh(
        y,
        [row.ratio for row in rows],
        xerr=[
            [row.ratio - row.ratio_q1 for row in rows],
            [row.ratio_q3 - row.ratio for row in rows],
        ],
        color=colours,
        capsize=3,
    )
    ratios.axvline(1.0, color="black", linewidth=0.8)
    ratios.set_yticks(y, names, fontsize=8)
    ratios.set_xlabel("time per step / plain TensorFlow's (middle half of blocks)")
    need = " + ".join(_tiers.TIERS[name].label for name in report.need)
    ratios.legend(
        handles=[
            Patch(color=_PORTABLE, label=f"gives {need}"),
            Patch(color=_TIED, label=f"does not give {need}"),
        ],
        fontsize=8,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=2,
    )
    labels, grown = [], []
    for row in report.candidates():
        for growth in row.growth(report.plain)[:3]:
            labels.append(f"{growth.op}\n({row.setting.name})")
            grown.append(growth.grew_ms)
    if grown:
        positions = list(range(len(grown)))[::-1]
        ops.barh(positions, grown, color=_TIED)
        ops.set_yticks(positions, labels, fontsize=7)
        ops.set_xlabel("ms per step added over plain TensorFlow")
    else:
        ops.text(0.5, 0.5, "no op grew", ha="center", va="center")
        ops.set_axis_off()
    figure.suptitle(
        f"tfdet cost {report.target}: {report.cores} cores ({report.cpu_model})",
        fontsize=10,
    )
    figure.savefig(os.fspath(path), dpi=dpi)
    return os.fspath(path)
