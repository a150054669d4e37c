"""A picture of where two traces part: ulps per step, and which weights differ.

Top panel: per step, the distance in ulps between trace A's and trace B's
loss and each metric (0 where the bits are equal; a symmetric log scale, so
that 0, 1 and a million ulps all show). Bottom panel: a step x variable map
of whether each fingerprint is equal or different, the first row being the
fingerprint of all weights. Fingerprints are hashes: they say equal or not,
never how far apart, so this panel has no ulps. Steps without per-variable
fingerprints (they are recorded every `variables_every` steps) and steps
recorded in only one trace are left blank. The first divergence, as
`tfdet diff` reports it, is marked on both panels.

matplotlib is optional (`pip install tfdet[plot]`); it is imported only when
a picture is drawn, with the non-interactive Agg canvas (no display needed,
no change to pyplot's global backend).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tfdet._record import _bits, _diff, _trace

# Colours: equal, different; blank (white) is "not recorded".
_EQUAL = "#c7e9c0"
_DIFFERENT = "#d62728"
_MISSING = "#ffffff"
# Beyond this many variables the heat map's row labels would overlap.
_MAX_LABELLED_ROWS = 40


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"Expected matplotlib for --plot. Received: {error}. Install it with "
            "`pip install tfdet[plot]`."
        ) from error


def _ulps(a: dict[str, str] | None, b: dict[str, str] | None) -> float:
    """Ulps between two bits dicts; 0 when the bits are equal, NaN if unknown."""
    if a is None or b is None:
        return float("nan")
    if a.get("dtype") == b.get("dtype") and a.get("bits") == b.get("bits"):
        return 0.0
    ulps = _bits.ulp_distance(a, b)
    return float("nan") if ulps is None else float(ulps)


def _scalar_series(
    steps: list[int], a: dict[int, Any], b: dict[int, Any]
) -> dict[str, np.ndarray]:
    """`{quantity: ulps per step}` for the loss and every metric."""
    names: set[str] = set()
    for record in [*a.values(), *b.values()]:
        names.update(f"metric:{name}" for name in (record.get("metrics") or {}))
    series = {}
    for quantity in ["loss", *sorted(names)]:
        values = []
        for step in steps:
            ra, rb = a.get(step), b.get(step)
            if ra is None or rb is None:
                values.append(float("nan"))
            elif quantity == "loss":
                values.append(_ulps(ra.get("loss"), rb.get("loss")))
            else:
                name = quantity.removeprefix("metric:")
                values.append(
                    _ulps(
                        (ra.get("metrics") or {}).get(name),
                        (rb.get("metrics") or {}).get(name),
                    )
                )
        if quantity == "loss" and all(np.isnan(values)):
            continue  # No loss recorded at all: nothing to draw.
        series[quantity] = np.array(values, dtype=float)
    return series


def _weights_map(
    steps: list[int], a: dict[int, Any], b: dict[int, Any], count: int
) -> np.ndarray:
    """`(1 + count, len(steps))`: 0 equal, 1 different, NaN not recorded."""
    grid = np.full((1 + count, len(steps)), np.nan)
    for column, step in enumerate(steps):
        ra, rb = a.get(step), b.get(step)
        if ra is None or rb is None:
            continue
        grid[0, column] = float(ra.get("weights") != rb.get("weights"))
        va, vb = ra.get("variables"), rb.get("variables")
        if va and vb:
            for row, (fa, fb) in enumerate(zip(va, vb, strict=False)):
                if row < count:
                    grid[1 + row, column] = float(fa != fb)
    return grid


def _edges(steps: list[int]) -> np.ndarray:
    """Cell edges around each step, halfway to its neighbours."""
    x = np.asarray(steps, dtype=float)
    if len(x) == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    middles = (x[1:] + x[:-1]) / 2
    return np.concatenate(
        [[x[0] - (middles[0] - x[0])], middles, [x[-1] + (x[-1] - middles[-1])]]
    )


def plot_comparison(
    trace_a: str | os.PathLike[str] | _trace.Trace,
    trace_b: str | os.PathLike[str] | _trace.Trace,
    path: str | os.PathLike[str],
    *,
    dpi: int = 120,
) -> str:
    """Draws where trace B's bits part from trace A's, and saves it as an image.

    Example:

    >>> plot_comparison("run.jsonl", "rerun.jsonl", "diff.png")  # doctest: +SKIP

    Args:
        trace_a: The expected trace (a path, or a `Trace` from `_trace.read`).
        trace_b: The trace compared with it.
        path: The image file; its extension picks the format (".png",
            ".svg", ".pdf", ...).
        dpi: Resolution of raster formats.

    Returns:
        `path`, as a string.

    Raises:
        ImportError: matplotlib is not installed (`pip install tfdet[plot]`).
        TraceFormatError: a trace cannot be read.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    a, b = _trace.load(trace_a), _trace.load(trace_b)
    comparison = _diff.compare(a, b)
    steps_a, steps_b = a.by_step(), b.by_step()
    steps = sorted(set(steps_a) | set(steps_b))
    if not steps:
        raise ValueError(
            "Expected at least one recorded step to draw. Received: no step "
            f"records in {a.path!r} or {b.path!r}."
        )
    # Fingerprints are matched by position, as `tfdet diff` does; A names them.
    variables = a.variables or [
        str(i)
        for i in range(max((len(r.get("variables") or []) for r in a.steps), default=0))
    ]
    series = _scalar_series(steps, steps_a, steps_b)
    grid = _weights_map(steps, steps_a, steps_b, len(variables))
    rows = ["all weights", *variables]

    height_map = min(max(1.2, 0.16 * len(rows)), 7.0)
    figure = Figure(figsize=(10, 3.2 + height_map + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [3.2, height_map]}
    )

    name_a = os.path.basename(a.path) if a.path else "A"
    name_b = os.path.basename(b.path) if b.path else "B"
    title = f"tfdet: {name_a} (A) vs {name_b} (B)"
    if comparison.profile_differences:
        shown = ", ".join(
            f"{k}: {va} vs {vb}"
            for k, (va, vb) in list(comparison.profile_differences.items())[:3]
        )
        more = len(comparison.profile_differences) - 3
        title += f"\nprofiles differ: {shown}" + (
            f" (+{more} more)" if more > 0 else ""
        )
    figure.suptitle(title, fontsize=10)

    x = np.asarray(steps, dtype=float)
    for index, (quantity, values) in enumerate(series.items()):
        # Markers and dashes differ, so that curves lying on each other show.
        top.plot(
            x,
            values,
            # Beyond a few hundred steps markers would only blot the lines.
            marker="osD^v<>"[index % 7] if len(steps) <= 300 else None,
            markersize=max(6 - 1.5 * index, 3),  # The first drawn stays visible.
            linestyle=("-", "--", ":", "-.")[index % 4],
            linewidth=1,
            label=quantity,
        )
    top.set_yscale("symlog", linthresh=1)
    largest = max(
        (np.nanmax(v) for v in series.values() if np.isfinite(v).any()), default=0
    )
    decades = int(np.ceil(np.log10(max(largest, 1) * 2)))
    top.set_ylim(-0.5, 10.0 ** max(decades, 1))
    stride = max(1, (decades + 1) // 6)
    ticks = [0.0, *(10.0**k for k in range(0, decades + 1, stride))]
    top.set_yticks(
        ticks,
        [
            "0",
            *(f"{t:.0f}" if t < 1e5 else f"1e{round(np.log10(t))}" for t in ticks[1:]),
        ],
    )
    top.set_ylabel("ulps between A and B\n(0: same bits)")
    top.grid(True, which="major", alpha=0.3)
    if series:
        top.legend(loc="upper left", fontsize=8)

    colours = ListedColormap([_EQUAL, _DIFFERENT]).with_extremes(bad=_MISSING)
    bottom.pcolormesh(
        _edges(steps),
        np.arange(len(rows) + 1) - 0.5,
        np.ma.masked_invalid(grid),
        cmap=colours,
        vmin=0,
        vmax=1,
        # Cell borders help to count a few cells and would blot out many.
        edgecolors="white" if grid.size <= 5000 else "none",
        linewidth=0.5,
    )
    bottom.axhline(0.5, color="black", linewidth=0.8)  # "all weights" apart.
    bottom.set_ylim(len(rows) - 0.5, -0.5)  # "all weights" on top, model order below.
    if len(rows) <= _MAX_LABELLED_ROWS:
        bottom.set_yticks(range(len(rows)), rows, fontsize=7)
    else:
        bottom.set_yticks([0], rows[:1], fontsize=7)
        bottom.set_ylabel(f"{len(variables)} variables, in model order", fontsize=8)
    bottom.set_xlabel("step")
    bottom.legend(
        handles=[
            Patch(facecolor=_EQUAL, label="fingerprint equal"),
            Patch(facecolor=_DIFFERENT, label="fingerprint differs"),
            Patch(facecolor=_MISSING, edgecolor="grey", label="not recorded"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )

    divergence = comparison.divergence
    if divergence is not None and divergence.step is not None:
        for axis in (top, bottom):
            axis.axvline(divergence.step, color="black", linestyle="--", linewidth=1)
        ulps = "" if divergence.ulps is None else f" ({divergence.ulps} ulps)"
        top.set_title(
            f"first divergence (dashed line): step {divergence.step}, "
            f"{divergence.quantity}{ulps}",
            fontsize=9,
        )
    elif divergence is None:
        top.set_title(
            f"identical: every bit equal over {comparison.steps_compared} steps",
            fontsize=9,
        )

    path = os.fspath(path)
    figure.savefig(path, dpi=dpi)
    return path
