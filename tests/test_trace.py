"""Trace files: round trip, cut lines from killed runs, non-traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_tfdet
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdet import _trace
from tfdet._errors import TraceFormatError

PROFILE = {
    "seed": 0,
    "intra_op_threads": 1,
    "inter_op_threads": 1,
    "onednn_opts": True,
    "cpu_isa": "AVX2",
    "op_determinism": True,
    "xla_determinism": True,
    "python_hash_seed": "0",
    "patches": [],
    "keras": "keras3",
    "tensorflow_version": "2.21.0",
    "keras_version": "3.15.1",
    "numpy_version": "2.0.0",
    "python_version": "3.11.7",
}


def _step(step: int, loss_bits: str = "40135d8e") -> dict:
    return {
        "epoch": 0,
        "step": step,
        "batch": step,
        "loss": {"dtype": "float32", "bits": loss_bits, "value": "2.3"},
        "metrics": {},
        "weights": f"{step:032x}",
        "variables": [f"{step:016x}"],
    }


def write_trace(
    path, steps: int = 3, profile: dict | None = None, environment=None, **header
) -> str:
    environment = environment or {"cpu_count": 2}
    header = _trace.make_header(
        profile or PROFILE, environment, ["dense/kernel"], **header
    )
    with _trace.TraceWriter(path, header) as writer:
        for step in range(steps):
            writer.write_step(_step(step))
    return str(path)


def test_round_trip(tmp_path):
    path = write_trace(tmp_path / "run.jsonl", steps=3, every=1)
    trace = _trace.read(path)
    assert [record["step"] for record in trace.steps] == [0, 1, 2]
    assert trace.steps[1] == _step(1)
    assert trace.profile is not None and trace.profile.intra_op_threads == 1
    assert trace.variables == ["dense/kernel"]
    assert trace.header["every"] == 1
    assert not trace.truncated


def test_each_line_is_on_disk_before_the_writer_closes(tmp_path):
    # What a killed run leaves: everything written so far, without close().
    path = tmp_path / "live.jsonl"
    writer = _trace.TraceWriter(path, _trace.make_header(PROFILE, {}))
    writer.write_step(_step(0))
    writer.write_step(_step(1))
    assert len(_trace.read(path).steps) == 2
    writer.close()


def test_a_line_cut_anywhere_reads_back_the_whole_steps(tmp_path):
    path = write_trace(tmp_path / "run.jsonl", steps=3)
    data = Path(path).read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    # Every cut inside the last line (a run killed while writing it).
    for cut in range(last_start + 1, len(data) - 1):
        cut_path = tmp_path / "cut.jsonl"
        cut_path.write_bytes(data[:cut])
        with pytest.warns(UserWarning, match="cut line 4"):
            trace = _trace.read(cut_path)
        assert [record["step"] for record in trace.steps] == [0, 1]
        assert trace.truncated
    # Cut exactly at a line end: whole steps, nothing to warn about.
    cut_path.write_bytes(data[:last_start])
    trace = _trace.read(cut_path)
    assert len(trace.steps) == 2 and not trace.truncated


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"hello\n",
        b'{"format": "something-else"}\n',
        b"[1, 2, 3]\n",
        b"\xff\xfe binary",
        b'{"format": "tfdet-trace", "version": 99}\n',
    ],
)
def test_non_traces_are_format_errors(tmp_path, content):
    path = tmp_path / "not_a_trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError):
        _trace.read(path)


def test_cut_header_and_corrupt_middle_line_are_format_errors(tmp_path):
    path = write_trace(tmp_path / "run.jsonl", steps=3)
    lines = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
    cut_header = tmp_path / "cut_header.jsonl"
    cut_header.write_text(lines[0][:20], encoding="utf-8")
    with pytest.raises(TraceFormatError, match="header line is cut"):
        _trace.read(cut_header)
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(lines[0] + "garbage\n" + "".join(lines[2:]), encoding="utf-8")
    with pytest.raises(TraceFormatError, match="line 2"):
        _trace.read(corrupt)
    with pytest.raises(TraceFormatError, match="readable"):
        _trace.read(tmp_path / "missing.jsonl")


@settings(max_examples=200, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 40)),
    variable=st.integers(0, 2),
    bit=st.integers(0, 31),
    data=st.data(),
)
def test_weights_fingerprint_catches_any_single_flipped_bit(shape, variable, bit, data):
    # Host model of `_bits.device_checksums` (wrap-around plain and
    # odd-weighted sums of the uint32 words), which the callback feeds in.
    rng = np.random.default_rng(0)
    words = [
        rng.integers(0, 2**32, size=shape[0] * shape[1], dtype=np.uint64)
        for _ in range(3)
    ]
    index = data.draw(st.integers(0, words[variable].size - 1))

    def checksums(arrays):
        rows = []
        for array in arrays:
            odd = np.arange(array.size, dtype=np.uint64) * 2 + 1
            rows.append([int(array.sum() % 2**32), int((array * odd).sum() % 2**32)])
        return np.array(rows, dtype=np.uint32)

    flipped = [w.copy() for w in words]
    flipped[variable][index] ^= np.uint64(1 << bit)
    before, after = checksums(words), checksums(flipped)
    assert _trace.weights_fingerprint(before) != _trace.weights_fingerprint(after)
    changed = [
        i
        for i, (a, b) in enumerate(
            zip(
                _trace.variable_fingerprints(before),
                _trace.variable_fingerprints(after),
                strict=True,
            )
        )
        if a != b
    ]
    assert changed == [variable]


def test_cli_diff_exits_2_on_a_non_trace_and_reads_a_cut_trace(tmp_path):
    good = write_trace(tmp_path / "good.jsonl", steps=3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not a trace\n", encoding="utf-8")
    result = run_tfdet("diff", str(bad), good)
    assert result.returncode == 2, result.stderr
    assert "Expected a tfdet trace" in result.stderr
    data = Path(good).read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) - 10])
    report = tmp_path / "report.json"
    result = run_tfdet("diff", good, str(cut), "--json", str(report))
    # The cut trace has 2 of the 3 steps: equal where both exist, but shorter.
    assert result.returncode == 1, result.stderr
    assert "cut line" in result.stdout
    facts = json.loads(report.read_text())
    assert facts["steps"] == [3, 2] and facts["truncated"] == [False, True]
    assert facts["divergence"] is None
