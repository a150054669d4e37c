"""`tfdet diff` and trace comparison: first diverging step, and why."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import clean_env, run_tfdet
from tests.test_trace import PROFILE, write_trace
from tfdet._cli import main
from tfdet._record import _diff, _trace


def _record(step: int, loss: str = "40135d8e", weights: str = "a" * 32, variables=None):
    return {
        "epoch": 0,
        "step": step,
        "loss": {"dtype": "float32", "bits": loss, "value": "x"},
        "metrics": {
            "accuracy": {"dtype": "float32", "bits": "3f000000", "value": "0.5"}
        },
        "weights": weights,
        "variables": variables or ["1" * 16, "2" * 16],
    }


def test_compare_steps_reports_the_first_quantity_with_ulps():
    assert _diff.compare_steps(_record(0), _record(0)) is None
    found = _diff.compare_steps(_record(4), _record(4, loss="40135d8f"))
    assert (found.step, found.quantity, found.ulps) == (4, "loss", 1)
    assert "0x40135d8e" in found.expected and "0x40135d8f" in found.received
    metric = _record(1)
    metric["metrics"]["accuracy"]["bits"] = "3f000002"
    found = _diff.compare_steps(_record(1), metric)
    assert (found.quantity, found.ulps) == ("metric:accuracy", 2)


def test_compare_steps_names_the_first_differing_variable():
    a = _record(2, weights="a" * 32, variables=["1" * 16, "2" * 16])
    b = _record(2, weights="b" * 32, variables=["1" * 16, "3" * 16])
    found = _diff.compare_steps(a, b, ["dense/kernel", "dense/bias"])
    assert found.quantity == "weights:dense/bias"
    assert (found.expected, found.received) == ("2" * 16, "3" * 16)
    del a["variables"], b["variables"]
    assert _diff.compare_steps(a, b).quantity == "weights"
    error = found.to_error()
    assert (error.step, error.quantity, error.expected) == (
        2,
        "weights:dense/bias",
        "2" * 16,
    )


def test_cli_diff_exit_codes_and_json(tmp_path):
    a = write_trace(tmp_path / "a.jsonl", steps=3)
    same = write_trace(tmp_path / "same.jsonl", steps=3)
    other_profile = dict(PROFILE, intra_op_threads=2)
    b = write_trace(
        tmp_path / "b.jsonl",
        steps=3,
        profile=other_profile,
        environment={"cpu_count": 2, "env": {"TF_NUM_INTRAOP_THREADS": "2"}},
    )
    # B: same first step, loss 3 ulps off at step 1.
    lines = Path(b).read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[2])
    record["loss"]["bits"] = "40135d91"
    lines[2] = json.dumps(record)
    Path(b).write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["tfdet", "diff", a, same]) == 0
    report = tmp_path / "report.json"
    assert main(["tfdet", "diff", a, b, "--json", str(report)]) == 1
    facts = json.loads(report.read_text())
    assert facts["profile_differences"] == {"intra_op_threads": [1, 2]}
    assert facts["fingerprint_differences"] == {
        "env.TF_NUM_INTRAOP_THREADS": [None, "2"]
    }
    assert facts["divergence"]["step"] == 1
    assert facts["divergence"]["quantity"] == "loss"
    assert facts["divergence"]["ulps"] == 3
    assert main(["tfdet", "diff", a, str(tmp_path / "missing.jsonl")]) == 2


def _write_steps(path, steps: list[int], loss_at: dict[int, str] | None = None):
    header = _trace.make_header(PROFILE, {"cpu_count": 2}, ["0:dense/kernel"])
    with _trace.TraceWriter(path, header) as writer:
        for step in steps:
            record = _record(step, variables=["1" * 16])
            record["loss"]["bits"] = (loss_at or {}).get(step, "40135d8e")
            writer.write_step(record)
    return str(path)


def test_traces_with_different_steps_are_not_identical(tmp_path, capsys):
    a = _write_steps(tmp_path / "a.jsonl", [0, 1, 2])
    b = _write_steps(tmp_path / "b.jsonl", [0, 1, 7])
    comparison = _diff.compare(_trace.read(a), _trace.read(b))
    assert not comparison.identical and comparison.steps_compared == 2
    found = comparison.divergence
    assert (found.step, found.quantity) == (2, "steps")
    assert found.expected == "recorded"
    assert found.received == "not recorded (last recorded step: 7)"
    report = tmp_path / "report.json"
    assert main(["tfdet", "diff", a, b, "--json", str(report)]) == 1
    assert "bit-identical" not in capsys.readouterr().out
    assert json.loads(report.read_text())["divergence"]["quantity"] == "steps"
    # Reversed, step 2 is the extra one; a bit difference before it comes first.
    found = _diff.compare(_trace.read(b), _trace.read(a)).divergence
    assert (found.step, found.expected) == (2, "not recorded (last recorded step: 7)")
    c = _write_steps(tmp_path / "c.jsonl", [0, 1, 7], loss_at={1: "40135d8f"})
    found = _diff.compare(_trace.read(a), _trace.read(c)).divergence
    assert (found.step, found.quantity) == (1, "loss")


_RECORD = """
import sys
import tensorflow as tf
import keras
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
keras.utils.set_random_seed(1)
import tfdet
from tfdet._target import _load
built = _load.build("builtin:cnn", seed=1)
built.model.fit(built.x, built.y, batch_size=32, epochs=2, verbose=0, shuffle=False,
                callbacks=[tfdet.DeterminismCallback(trace=sys.argv[2])])
"""


def _record_traces(tmp_path, threads: list[int]) -> list[str]:
    """Records one trace per thread count, in concurrent fresh processes."""
    paths = [str(tmp_path / f"threads{n}_{i}.jsonl") for i, n in enumerate(threads)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_RECORD), str(n), path],
            env=clean_env(ONEDNN_MAX_CPU_ISA=None),
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, path in zip(threads, paths, strict=True)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
    return paths


def test_diff_of_runs_differing_only_in_thread_count(tmp_path):
    one, one_again, two = _record_traces(tmp_path, [1, 1, 2])
    # Same thread count in two processes: bit-identical (the comparison can pass).
    same = run_tfdet("diff", one, one_again)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "bit-identical: all 4 steps" in same.stdout
    # Thread count 1 vs 2 without tfdet's pinning: the bits part.
    report = tmp_path / "diff.json"
    result = run_tfdet("diff", one, two, "--json", str(report))
    assert result.returncode == 1, result.stdout + result.stderr
    facts = json.loads(report.read_text())
    assert facts["profile_differences"]["intra_op_threads"] == [1, 2]
    divergence = facts["divergence"]
    assert divergence["step"] == 0
    # Which quantity parts first (the loss or a weight) depends on the CPU.
    assert divergence["quantity"] == "loss" or divergence["quantity"].startswith(
        "weights:"
    )
    assert "intra_op_threads: 1 vs 2" in result.stdout
    assert "first diverging step: step 0" in result.stdout
    # The explanation comes before the bits.
    assert result.stdout.index("intra_op_threads") < result.stdout.index(
        "first diverging"
    )
    assert _trace.read(one).steps == _trace.read(one_again).steps


def test_header_only_traces_are_not_identical_and_exit_2(tmp_path, capsys):
    a = write_trace(tmp_path / "a.jsonl", steps=0)
    b = write_trace(tmp_path / "b.jsonl", steps=0)
    comparison = _diff.compare(_trace.read(a), _trace.read(b))
    assert comparison.empty and not comparison.identical
    report = tmp_path / "report.json"
    assert main(["tfdet", "diff", a, b, "--json", str(report)]) == 2
    out = capsys.readouterr().out
    assert "nothing compared" in out and "bit-identical" not in out
    facts = json.loads(report.read_text())
    assert facts["empty"] and not facts["identical"]
    # One header-only trace against one with steps is a divergence (exit 1).
    full = write_trace(tmp_path / "full.jsonl", steps=2)
    assert main(["tfdet", "diff", a, full]) == 1


def test_weights_detail_names_the_first_element_and_counts(tmp_path):
    import numpy as np

    a = np.ones((2, 3), np.float32)
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(1), np.float32(2))
    b[1, 2] = np.float32(1.5)
    np.savez(tmp_path / "a.npz", np.zeros(2, np.float32), a)
    np.savez(tmp_path / "b.npz", np.zeros(2, np.float32), b)
    detail = _diff.weights_detail(str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), 1)
    assert detail["index"] == [1, 0] and detail["ulps"] == 1
    assert detail["differing_elements"] == 2 and detail["size"] == 6
    assert detail["max_ulps"] == 2**22
    assert _diff.weights_detail(
        str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), 0
    ) == {"differing_elements": 0, "size": 2}
    assert _diff.weights_detail(str(tmp_path / "a.npz"), "missing.npz", 0) is None
    divergence = _diff.Divergence(3, 0, "weights:1:w", "x", "y", detail=detail)
    text = divergence.describe()
    assert "step 3" in text and "2 of 6 elements differ" in text
    assert "1.0 [float32 0x3f800000]" in text and "(1, 0)" in text
    error = divergence.to_error()
    assert (error.step, error.quantity, error.expected, error.received) == (
        3,
        "weights:1:w",
        "x",
        "y",
    )


def test_diff_names_cpu_facts_and_whether_they_change_bits(tmp_path, capsys):
    amd = {"cpu_vendor": "AuthenticAMD", "cpu_count": 2, "profile": PROFILE}
    intel = {"cpu_vendor": "GenuineIntel", "cpu_count": 16, "profile": PROFILE}
    a = write_trace(tmp_path / "amd.jsonl", environment=amd)
    b = write_trace(tmp_path / "intel.jsonl", environment=intel)
    comparison = _diff.compare(_trace.read(a), _trace.read(b))
    assert set(comparison.cpu_differences) == {"cpu_vendor", "cpu_count"}
    assert comparison.cpu_differences["cpu_vendor"]["changes_bits"] in ("yes", "may")
    # Pools are pinned by the profile: the core count alone changes no bits.
    assert comparison.cpu_differences["cpu_count"]["changes_bits"] == "no"
    assert main(["tfdet", "diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "cpu_vendor: 'AuthenticAMD' vs 'GenuineIntel'" in out


def test_diff_says_when_the_traces_come_from_two_models(tmp_path, capsys):
    a = write_trace(tmp_path / "a.jsonl")
    header = _trace.make_header(PROFILE, {"cpu_count": 2}, ["a/kernel", "b/kernel"])
    b = tmp_path / "b.jsonl"
    with _trace.TraceWriter(b, header) as writer:
        writer.write_step(_record(0))
    main(["tfdet", "diff", a, str(b)])
    assert "1 vs 2 variables" in capsys.readouterr().out


def test_diff_plot_writes_a_png_or_says_what_is_missing(tmp_path):
    a = write_trace(tmp_path / "a.jsonl")
    b = write_trace(tmp_path / "b.jsonl")
    picture = tmp_path / "diff.png"
    assert main(["tfdet", "diff", a, b, "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code = main(["tfdet", "diff", a, b, "--plot", str(tmp_path / "no" / "x.png")])
    assert code == 2


def test_diff_reports_a_difference_in_what_was_pinned_under_tf_distribute(
    tmp_path, capsys
):
    pinned = dict(PROFILE, distribution={"collective": "RING"})
    default = dict(PROFILE, distribution={"collective": "AUTO"})
    a = write_trace(tmp_path / "a.jsonl", steps=2, profile=pinned)
    b = write_trace(tmp_path / "b.jsonl", steps=2, profile=default)
    report = tmp_path / "report.json"
    assert main(["tfdet", "diff", a, b, "--json", str(report)]) == 0
    facts = json.loads(report.read_text())
    assert facts["profile_differences"] == {
        "distribution": [{"collective": "RING"}, {"collective": "AUTO"}]
    }
    assert "distribution" in capsys.readouterr().out


def test_json_to_a_fifo_with_a_reader_is_written_once(tmp_path):
    # The up-front writability check opened and closed the FIFO: its reader
    # got an end of file, and the report's own open then waited forever.
    import os
    import threading

    a = write_trace(tmp_path / "a.jsonl", steps=2)
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert main(["tfdet", "diff", a, a, "--json", str(fifo)]) == 0
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert json.loads(received[0])["identical"] is True


def test_json_to_a_full_disk_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    a = write_trace(tmp_path / "a.jsonl", steps=2)
    assert main(["tfdet", "diff", a, a, "--json", "/dev/full"]) == 3
    err = capsys.readouterr().err
    assert "Expected to write the report to '/dev/full'" in err
    assert "No space left on device" in err and "Traceback" not in err
