"""First-divergence search over worker results (no TensorFlow needed)."""

from __future__ import annotations

import numpy as np

from tfdet._record import _bits, _compare


def _result(tmp_path, name, losses, checksums, final):
    weights_file = tmp_path / f"{name}.npz"
    np.savez(weights_file, *final)
    return {
        "variables": ["0:dense/kernel", "1:dense/bias"],
        "steps": [
            {
                "step": i,
                "values": {"loss": _bits.value_bits(np.float32(loss))},
                "weights": sums,
            }
            for i, (loss, sums) in enumerate(zip(losses, checksums, strict=True))
        ],
        "final_weights": {
            f"{i}:{n}": _bits.array_digest(w)
            for i, (n, w) in enumerate(
                zip(["dense/kernel", "dense/bias"], final, strict=True)
            )
        },
        "weights_file": str(weights_file),
    }


def test_identical_results_have_no_divergence(tmp_path):
    final = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    a = _result(tmp_path, "a", [1.0, 0.5], [["x", "y"], ["z", "w"]], final)
    b = _result(tmp_path, "b", [1.0, 0.5], [["x", "y"], ["z", "w"]], final)
    assert _compare.first_divergence(a, b) is None


def test_loss_divergence_reports_step_bits_and_ulps(tmp_path):
    final = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    nudged = float(np.nextafter(np.float32(0.5), np.float32(1)))
    a = _result(tmp_path, "a", [1.0, 0.5], [["x", "y"], ["z", "w"]], final)
    b = _result(tmp_path, "b", [1.0, nudged], [["x", "y"], ["z", "w"]], final)
    divergence = _compare.first_divergence(a, b)
    assert (divergence.step, divergence.quantity, divergence.ulps) == (1, "loss", 1)
    assert "0x3f000000" in _compare.describe(divergence)


def test_weight_divergence_names_variable_and_first_element(tmp_path):
    final_a = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    final_b = [final_a[0].copy(), final_a[1].copy()]
    final_b[0][1, 0] = np.nextafter(np.float32(1), np.float32(2))
    a = _result(tmp_path, "a", [1.0, 0.5], [["x", "y"], ["z", "w"]], final_a)
    b = _result(tmp_path, "b", [1.0, 0.5], [["x", "y"], ["q", "w"]], final_b)
    divergence = _compare.first_divergence(a, b)
    assert divergence.step == 1 and divergence.quantity == "weights:0:dense/kernel"
    assert divergence.detail["index"] == [1, 0]
    assert (
        divergence.detail["differing_elements"] == 1 and divergence.detail["ulps"] == 1
    )


def test_final_digest_difference_is_caught_even_with_equal_checksums(tmp_path):
    final_a = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    final_b = [final_a[0], np.array([0.0, -0.0], np.float32)]
    a = _result(tmp_path, "a", [1.0], [["x", "y"]], final_a)
    b = _result(tmp_path, "b", [1.0], [["x", "y"]], final_b)
    divergence = _compare.first_divergence(a, b)
    assert divergence.step is None and divergence.quantity == "weights:1:dense/bias"


def test_missing_steps_are_a_divergence(tmp_path):
    final = [np.ones((2, 2), np.float32), np.zeros(2, np.float32)]
    a = _result(tmp_path, "a", [1.0, 0.5], [["x", "y"], ["z", "w"]], final)
    b = _result(tmp_path, "b", [1.0], [["x", "y"]], final)
    assert _compare.first_divergence(a, b).quantity == "steps"
