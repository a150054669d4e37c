"""`tfdet._record._plot`: the picture of two traces, from hand-written traces."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest

from tfdet._record import _bits, _plot, _trace

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIABLES = [
    f"{i}:dense_{i // 2}/{'kernel' if i % 2 == 0 else 'bias'}" for i in range(6)
]
STEPS = 12


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def write_trace(path, *, diverge_at: int | None = None, every: int = 2) -> str:
    """A trace of STEPS steps; from `diverge_at` on, B's bits drift apart.

    The loss drifts by 4**k ulps at k steps past the divergence, the accuracy
    metric one step later, and from the divergence step on the weights of
    the first dense layer differ, the rest a step later.
    """
    header = _trace.make_header(None, None, VARIABLES, every=every)
    with _trace.TraceWriter(path, header) as writer:
        for step in range(STEPS):
            late = None if diverge_at is None else step - diverge_at
            loss = np.float32(1.0 / (step + 1))
            accuracy = np.float32(step / STEPS)
            if late is not None and late >= 0:
                loss = np.float32(loss).view(np.uint32) + np.uint32(4**late)
                loss = loss.view(np.float32)
            if late is not None and late >= 1:
                accuracy = np.nextafter(accuracy, np.float32(1))
            variables = [
                _fingerprint(
                    step,
                    index,
                    late is not None and late >= (0 if index < 2 else 1),
                )
                for index in range(len(VARIABLES))
            ]
            record = {
                "epoch": 0,
                "step": step,
                "batch": step,
                "loss": _bits.value_bits(loss),
                "metrics": {"accuracy": _bits.value_bits(accuracy)},
                "weights": _fingerprint(step, *variables),
            }
            if step % every == 0:
                record["variables"] = variables
            writer.write_step(record)
    return str(path)


def assert_png(path) -> None:
    with open(path, "rb") as file:
        data = file.read()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000


def test_identical_pair(tmp_path):
    a = write_trace(tmp_path / "a.jsonl")
    b = write_trace(tmp_path / "b.jsonl")
    out = _plot.plot_comparison(a, b, tmp_path / "identical.png")
    assert out == str(tmp_path / "identical.png")
    assert_png(out)


def test_diverging_pair(tmp_path):
    a = write_trace(tmp_path / "a.jsonl")
    # At step 4 only dense_0's fingerprints differ, from step 6 (the next
    # with per-variable fingerprints) all of them.
    b = write_trace(tmp_path / "b.jsonl", diverge_at=4)
    assert_png(_plot.plot_comparison(a, b, tmp_path / "diverged.png"))


def test_series_and_map_values(tmp_path):
    # What is drawn: ulps per step, equal/different/not recorded per variable.
    a = _trace.read(write_trace(tmp_path / "a.jsonl"))
    b = _trace.read(write_trace(tmp_path / "b.jsonl", diverge_at=5))
    steps = list(range(STEPS))
    series = _plot._scalar_series(steps, a.by_step(), b.by_step())
    assert list(series["loss"]) == [0] * 5 + [4**k for k in range(STEPS - 5)]
    assert list(series["metric:accuracy"]) == [0] * 6 + [1] * (STEPS - 6)
    grid = _plot._weights_map(steps, a.by_step(), b.by_step(), len(VARIABLES))
    assert list(grid[0]) == [0] * 5 + [1] * (STEPS - 5)
    assert grid[1, 4] == 0 and grid[1, 6] == 1 and grid[3, 6] == 1
    assert np.isnan(grid[1, 5])  # Odd steps carry no per-variable fingerprints.


def test_trace_shorter_than_other(tmp_path):
    a = write_trace(tmp_path / "a.jsonl")
    b_path = tmp_path / "b.jsonl"
    write_trace(b_path)
    lines = b_path.read_text(encoding="utf-8").splitlines()
    b_path.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
    assert_png(_plot.plot_comparison(a, b_path, tmp_path / "short.png"))


def test_without_matplotlib(tmp_path, monkeypatch):
    a = write_trace(tmp_path / "a.jsonl")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install tfdet\[plot\]"):
        _plot.plot_comparison(a, a, tmp_path / "never.png")
    assert not (tmp_path / "never.png").exists()


def test_no_steps(tmp_path):
    path = tmp_path / "empty.jsonl"
    with _trace.TraceWriter(path, _trace.make_header(None, None, VARIABLES)):
        pass
    with pytest.raises(ValueError, match="at least one recorded step"):
        _plot.plot_comparison(path, path, tmp_path / "never.png")
