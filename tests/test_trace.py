"""Trace files: round trip, cut lines from killed runs, non-traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import run_tfdet
from tfdet._cli import main
from tfdet._errors import TraceFormatError
from tfdet._record import _bits, _trace

# Imported before hypothesis runs: TensorFlow raises the recursion limit on
# import, which hypothesis warns about when it happens inside a test.
tf = pytest.importorskip("tensorflow")

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


_CORRUPT_STEPS = {
    "step not an int": {"step": "x"},
    "step a bool": {"step": True},
    "negative step": {"step": -1},
    "loss not bits": {"loss": "abc"},
    "loss without bits": {"loss": {"dtype": "float32"}},
    "loss bits not hex": {"loss": {"dtype": "float32", "bits": "zz"}},
    "loss dtype unknown": {"loss": {"dtype": "float99", "bits": "00"}},
    "metrics not an object": {"metrics": [1, 2]},
    "metric not bits": {"metrics": {"accuracy": 0.5}},
    "weights not a string": {"weights": 7},
    "weights missing": {"weights": None},
    "variables not strings": {"variables": [1]},
    "epoch not an int": {"epoch": "0"},
}


def _with_step_line(tmp_path, position: int, line: str, newline: bool) -> Path:
    path = Path(write_trace(tmp_path / "run.jsonl", steps=3))
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[position] = line
    path.write_text("\n".join(lines) + ("\n" if newline else ""), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "change", list(_CORRUPT_STEPS.values()), ids=list(_CORRUPT_STEPS)
)
def test_a_corrupt_step_record_is_a_format_error(tmp_path, change):
    line = json.dumps({**_step(1), **change})
    # In the middle: an error naming the line.
    path = _with_step_line(tmp_path, 2, line, newline=True)
    with pytest.raises(TraceFormatError, match="line 3"):
        _trace.read(path)
    # As the last, whole line: still an error (a killed run cuts, not corrupts).
    path = _with_step_line(tmp_path, 3, line, newline=True)
    with pytest.raises(TraceFormatError, match="line 4"):
        _trace.read(path)


@pytest.mark.parametrize(
    "change",
    [
        {"profile": "zz"},
        {"environment": [1]},
        {"version": True},
        {"version": 0},
        {"version": 1},
        {"version": "1"},
        {"variables": "dense/kernel"},
    ],
    ids=str,
)
def test_a_corrupt_header_is_a_format_error(tmp_path, change):
    path = Path(write_trace(tmp_path / "run.jsonl", steps=2))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[0] = json.dumps({**json.loads(lines[0]), **change}) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TraceFormatError, match="Expected"):
        _trace.read(path)


def test_a_step_recorded_twice_is_a_format_error(tmp_path):
    path = write_trace(tmp_path / "dup.jsonl", steps=3)
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(_step(1)) + "\n")
    with pytest.raises(TraceFormatError, match=r"step 1 again on line 5"):
        _trace.read(path)
    assert main(["tfdet", "diff", path, path]) == 2


def test_step_record_is_the_format_read_back(tmp_path):
    checksums = np.array([[1, 2], [3, 4]], np.uint32)
    logs = {"loss": 0.5, "accuracy": np.float32(0.25), "size": 32, "per_class": [1, 2]}
    record = _trace.step_record(4, logs, checksums, epoch=1, batch=2)
    assert (record["epoch"], record["step"], record["batch"]) == (1, 4, 2)
    assert record["loss"] == _bits.value_bits(np.float32(0.5))
    assert set(record["metrics"]) == {"accuracy", "per_class"}  # no bookkeeping
    assert record["metrics"]["per_class"]["shape"] == [2]
    assert record["weights"] == _trace.weights_fingerprint(checksums)
    assert record["variables"] == ["0000000100000002", "0000000300000004"]
    assert "variables" not in _trace.step_record(
        0, logs, checksums, with_variables=False
    )
    header = _trace.make_header(PROFILE, {}, ["a", "b"])
    with _trace.TraceWriter(tmp_path / "t.jsonl", header) as writer:
        writer.write_step(record)
    assert _trace.read(tmp_path / "t.jsonl").steps == [json.loads(json.dumps(record))]


def test_cli_diff_exits_2_on_corrupt_records(tmp_path, capsys):
    good = write_trace(tmp_path / "good.jsonl", steps=3)
    for name in ("step not an int", "loss not bits"):
        line = json.dumps({**_step(1), **_CORRUPT_STEPS[name]})
        bad = _with_step_line(tmp_path / name.replace(" ", "_"), 2, line, True)
        assert main(["tfdet", "diff", good, str(bad)]) == 2
    header = Path(write_trace(tmp_path / "header.jsonl", steps=3))
    lines = header.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[0] = json.dumps({**json.loads(lines[0]), "profile": "zz"}) + "\n"
    header.write_text("".join(lines), encoding="utf-8")
    assert main(["tfdet", "diff", good, str(header)]) == 2
    assert "Traceback" not in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(
    variable=st.integers(0, 2),
    position=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 63),
)
def test_weights_fingerprint_catches_any_single_flipped_bit(variable, position, bit):
    # The real device checksums of three variables (float32, float64, int32),
    # as the callback takes them, through the trace's fingerprints.
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal((3, 40)).astype(np.float32),
        rng.standard_normal(17),
        rng.integers(-1000, 1000, size=(2, 5), dtype=np.int32),
    ]
    flipped = [array.copy() for array in arrays]
    target = flipped[variable]
    index = int(position * target.size)
    width = target.dtype.itemsize * 8
    unsigned = f"u{target.dtype.itemsize}"
    target.view(unsigned).ravel()[index] ^= np.array(1 << (bit % width)).astype(
        unsigned
    )
    before = _bits.device_checksums([tf.Variable(a) for a in arrays])
    after = _bits.device_checksums([tf.Variable(a) for a in flipped])
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
    # The cut trace has 2 of the 3 steps: equal where both exist, but step 2
    # is missing from it.
    assert result.returncode == 1, result.stderr
    assert "cut line" in result.stdout
    facts = json.loads(report.read_text())
    assert facts["steps"] == [3, 2] and facts["truncated"] == [False, True]
    assert facts["identical"] is False
    assert facts["divergence"]["step"] == 2
    assert facts["divergence"]["quantity"] == "steps"
