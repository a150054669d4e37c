"""`tfdet check`'s comparison of two runs: `tfdet diff`'s trace comparison,
then the exact final digests, with element detail (no TensorFlow needed)."""

from __future__ import annotations

import numpy as np

from tfdet._commands import _check, _report_common
from tfdet._protocol import _perturb
from tfdet._protocol._result import CheckResult
from tfdet._record import _bits, _compare, _trace
from tfdet._runner import _outcome, _spawn

NAMES = ["0:dense/kernel", "1:dense/bias"]


def _run(tmp_path, name, losses, checksums, final) -> _outcome.RunOutcome:
    """A finished run as the runner returns it: its result and its trace read back."""
    weights_file = tmp_path / f"{name}.npz"
    np.savez(weights_file, *final)
    trace_path = tmp_path / f"{name}.jsonl"
    with _trace.TraceWriter(trace_path, _trace.make_header(None, {}, NAMES)) as writer:
        for step, (loss, sums) in enumerate(zip(losses, checksums, strict=True)):
            writer.write_step(
                _trace.step_record(step, {"loss": loss}, np.array(sums, np.uint32))
            )
    result = CheckResult(
        variables=tuple(NAMES),
        trace=str(trace_path),
        final_weights={
            n: _bits.array_digest(w) for n, w in zip(NAMES, final, strict=True)
        },
        weights_file=str(weights_file),
        entry_points=("train_on_batch",),
        xla={"on": False, "notice": None},
    )
    setup = _perturb.RunSetup(0)
    return _outcome.RunOutcome(
        setup, 0, result, "", False, 1.0, trace=_trace.read(trace_path)
    )


FINAL = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
SUMS = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]


def test_identical_runs_have_no_divergence(tmp_path):
    a = _run(tmp_path, "a", [1.0, 0.5], SUMS, FINAL)
    b = _run(tmp_path, "b", [1.0, 0.5], SUMS, FINAL)
    assert _compare.compare_runs(a, b) is None


def test_loss_divergence_reports_step_bits_and_ulps(tmp_path):
    nudged = float(np.nextafter(np.float32(0.5), np.float32(1)))
    a = _run(tmp_path, "a", [1.0, 0.5], SUMS, FINAL)
    b = _run(tmp_path, "b", [1.0, nudged], SUMS, FINAL)
    divergence = _compare.compare_runs(a, b)
    assert (divergence.step, divergence.quantity, divergence.ulps) == (1, "loss", 1)
    assert "0.5 [float32 0x3f000000]" in divergence.describe()


def test_weight_divergence_names_variable_and_first_element(tmp_path):
    final_b = [FINAL[0].copy(), FINAL[1].copy()]
    final_b[0][1, 0] = np.nextafter(np.float32(1), np.float32(2))
    a = _run(tmp_path, "a", [1.0, 0.5], SUMS, FINAL)
    b = _run(tmp_path, "b", [1.0, 0.5], [SUMS[0], [[9, 9], [7, 8]]], final_b)
    divergence = _compare.compare_runs(a, b)
    assert divergence.step == 1 and divergence.quantity == "weights:0:dense/kernel"
    assert divergence.detail["index"] == [1, 0]
    assert divergence.detail["variable"] == "0:dense/kernel"
    assert (divergence.detail["differing_elements"], divergence.detail["ulps"]) == (
        1,
        1,
    )


def test_final_digest_difference_is_caught_even_with_equal_checksums(tmp_path):
    final_b = [FINAL[0], np.array([0.0, -0.0], np.float32)]
    a = _run(tmp_path, "a", [1.0], SUMS[:1], FINAL)
    b = _run(tmp_path, "b", [1.0], SUMS[:1], final_b)
    divergence = _compare.compare_runs(a, b)
    assert divergence.step == 0
    assert divergence.quantity == "final weights:1:dense/bias"
    assert divergence.detail["index"] == [1]


def test_missing_steps_are_a_divergence(tmp_path):
    a = _run(tmp_path, "a", [1.0, 0.5], SUMS, FINAL)
    b = _run(tmp_path, "b", [1.0], SUMS[:1], FINAL)
    assert _compare.compare_runs(a, b).quantity == "steps"


def test_a_run_whose_trace_is_unreadable_is_a_failure_with_a_reason(tmp_path):
    a = _run(tmp_path, "a", [1.0], SUMS[:1], FINAL)
    (tmp_path / "a.jsonl").write_text("not a trace\n")
    unread = _outcome.RunOutcome(a.setup, 0, a.result, "", False, 1.0)
    ((run,),) = _spawn.read_traces([[unread]])
    assert not run.ok and "trace is unreadable" in run.reason


def test_nonfinite_losses_are_named_with_their_first_step(tmp_path):
    a = _run(tmp_path, "a", [1.0, float("nan")], SUMS, FINAL)
    assert _check._nonfinite(a.trace) == ["loss nan from step 1"]
    report = _check._run_report(a).to_dict()
    assert report["nonfinite"] == ["loss nan from step 1"]
    assert report["final_loss"] == "nan" and report["steps_recorded"] == 2


def test_verdict_and_exit_code_come_from_one_mapping():
    assert _report_common.combined_exit_code([0, 1]) == 1
    assert _report_common.combined_exit_code([1, 3, 0]) == 3
    assert _report_common.combined_exit_code([]) == 0
    assert _report_common.VERDICTS == {
        0: "identical",
        1: "diverged",
        3: "failed",
    }
    # A run that exits 0 without a result says so.
    setup = _perturb.RunSetup(0)
    outcome = _outcome.RunOutcome(setup, 0, None, "", False, 1.0)
    assert outcome.reason == "exited 0 without writing its result"


def test_a_rerun_is_the_same_through_a_step_whatever_follows_it(tmp_path):
    later = [SUMS[0], [[9, 9], [9, 9]]]
    baseline = [_run(tmp_path, "a", [1.0, 0.5], SUMS, FINAL)]
    rerun = [_run(tmp_path, "b", [1.0, 0.25], later, FINAL)]
    assert _compare.same_through(baseline, rerun, 0)
    assert not _compare.same_through(baseline, rerun, 1)
    assert not _compare.same_through(baseline, rerun, None)


def test_the_earliest_divergence_of_any_worker_is_the_runs(tmp_path):
    nudged = float(np.nextafter(np.float32(0.5), np.float32(1)))
    same = _run(tmp_path, "same", [1.0, 0.5], SUMS, FINAL)
    late = _run(tmp_path, "late", [1.0, nudged], SUMS, FINAL)
    early = _run(tmp_path, "early", [2.0, 0.5], SUMS, FINAL)
    worker, divergence = _compare.compare_jobs([same, same, same], [same, late, early])
    assert (worker, divergence.step) == (2, 0)
    worker, divergence = _compare.compare_jobs([same, same], [late, late])
    assert (worker, divergence.step) == (0, 1)  # A tie: the lowest worker.
    assert _compare.compare_jobs([same, same], [same, same]) == (0, None)


def test_a_multi_worker_runs_own_workers_are_compared_before_the_baseline():
    jobs = [["a0", "a1"], ["b0", "b1"]]
    assert _compare.comparisons(jobs) == [
        (0, 0, [(1, "a0", "a1")]),
        (1, 1, [(1, "b0", "b1")]),
        (0, 1, [(0, "a0", "b0"), (1, "a1", "b1")]),
    ]
