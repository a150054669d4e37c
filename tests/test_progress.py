"""`tfdet check`'s progress: the header first, in place on a terminal, lines in a log."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from tests.conftest import clean_env, run_tfdet
from tfdet._cli import _output
from tfdet._commands import _progress_lines

_CHECK = ("check", "--steps", "2", "--perturb", "none", "--device", "cpu")
_HEADER = "tfdet check builtin:cnn with tfdet.enable(): 2 runs x 2 steps on cpu"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _display(
    monkeypatch: pytest.MonkeyPatch, stream: io.StringIO
) -> _output.StepsDisplay:
    monkeypatch.setattr(sys, "stderr", stream)
    return _output.StepsDisplay()


def test_a_terminal_gets_one_line_per_device_rewritten_in_place(monkeypatch):
    stream = _Terminal()
    display = _display(monkeypatch, stream)
    display.message("starting")
    for done in (1, 2):
        for run in (0, 1):
            display.step("cpu", run, done, 2)
    display.message("diverged; re-running")
    display.step("gpu", 0, 1, 2)
    display.finish()
    assert stream.getvalue() == (
        "  starting\n"
        "\r  [cpu] run 0: 1/2"
        "\r  [cpu] run 0: 1/2  run 1: 1/2"
        "\r  [cpu] run 0: 2/2  run 1: 1/2"
        "\r  [cpu] run 0: 2/2  run 1: 2/2"
        "\n  diverged; re-running\n"
        "\r  [gpu] run 0: 1/2\n"
    )


def test_a_log_gets_plain_lines_a_tenth_of_the_steps_apart(monkeypatch):
    stream = io.StringIO()
    display = _display(monkeypatch, stream)
    for done in range(1, 201):
        display.step("cpu", 0, done, 200)
    display.finish()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "  [cpu] run 0: step 1/200"
    assert lines[1] == "  [cpu] run 0: step 20/200"
    assert lines[-1] == "  [cpu] run 0: step 200/200"
    assert len(lines) == 1 + _output.PIPED_LINES_PER_RUN


def _under_a_terminal(
    args: tuple[str, ...],
) -> tuple[bytes, subprocess.CompletedProcess]:
    """Runs tfdet with stderr on a pseudo-terminal; returns what it showed."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdet", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=clean_env(),
    )
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it.
            break
        if not data:
            break
        shown += data
    os.close(master)
    stdout, _ = process.communicate(timeout=600)
    return bytes(shown), subprocess.CompletedProcess(
        process.args, process.returncode, stdout
    )


def test_check_on_a_terminal_shows_the_header_before_any_run_starts():
    shown, result = _under_a_terminal(_CHECK)
    assert result.returncode == 0, shown.decode(errors="replace")
    text = shown.decode()
    # The order is the promise (no timing): header, then the start of
    # TensorFlow, then steps, rewritten in place.
    header = text.index(_HEADER)
    starting = text.index("[cpu] starting TensorFlow in 2 processes")
    first_step = text.index("\r  [cpu] run")
    assert header < starting < first_step
    assert "run 0: 2/2  run 1: 2/2" in text
    assert "step 1/2" not in text, "one line per run per step is for logs"


def test_check_into_a_pipe_writes_lines_only():
    result = run_tfdet(*_CHECK)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(_HEADER)
    assert lines[1] == "  [cpu] starting TensorFlow in 2 processes (2 steps each)"
    for run in (0, 1):
        assert f"  [cpu] run {run}: step 2/2" in lines


def test_locate_steps_go_through_the_same_display(monkeypatch):
    # check and locate hand their runs' steps to the display as numbers
    # (`_progress_lines.steps_to`), never as text parsed back.

    stream = io.StringIO()
    display = _display(monkeypatch, stream)
    on_step = _progress_lines.steps_to(display.message, display.step, "cpu")
    on_step(0, 1, 30)
    on_step(0, 2, 30)  # Not a tenth of 30: no line in a log.
    on_step(1, 3, 30)
    display.message("comparing the runs")
    assert stream.getvalue().splitlines() == [
        "  [cpu] run 0: step 1/30",
        "  [cpu] run 1: step 3/30",
        "  comparing the runs",
    ]
    # Without a display, the lines go to `progress`.
    lines = []
    _progress_lines.steps_to(lines.append, None, "cpu")(0, 3, 30)
    assert lines == ["[cpu] run 0: step 3/30"]
