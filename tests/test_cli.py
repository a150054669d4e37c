"""The CLI's one place that maps outcomes to exit codes."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import signal
import sys

import pytest

from tfdet import _cli
from tfdet._cli import _output
from tfdet._errors import DivergenceError, TargetError


def _namespace(func, **extra) -> argparse.Namespace:
    return argparse.Namespace(func=func, **extra)


def test_tfdet_errors_carry_their_exit_codes(capsys):
    def diverge(args):
        raise DivergenceError(3, "loss", 1.0, 2.0)

    def bad_target(args):
        raise TargetError("no such thing")

    assert _cli.execute(_namespace(diverge)) == 1
    assert _cli.execute(_namespace(bad_target)) == 2
    assert "no such thing" in capsys.readouterr().err


def test_unexpected_exception_is_exit_3_never_0_or_1(capsys):
    def crash(args):
        raise ZeroDivisionError("boom")

    assert _cli.execute(_namespace(crash)) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "ZeroDivisionError" in err


def test_interrupt_is_130():
    def interrupted(args):
        raise KeyboardInterrupt

    assert _cli.execute(_namespace(interrupted)) == 130


def test_unwritable_json_is_refused_before_the_command_runs(tmp_path):
    ran = []
    args = _namespace(lambda a: ran.append(1) or 0, json=str(tmp_path / "x" / "y.json"))
    assert _cli.execute(args) == 2
    assert ran == []


def test_json_check_leaves_no_empty_file_behind(tmp_path):
    path = tmp_path / "report.json"

    def fail(args):
        raise TargetError("bad")

    assert _cli.execute(_namespace(fail, json=str(path))) == 2
    assert not path.exists()


def test_help_lists_every_subcommand(capsys):
    assert _cli.main(["tfdet", "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("check", "run", "env", "diff", "locate", "scan"):
        assert name in out


@pytest.mark.parametrize("name", _cli.SUBCOMMANDS)
def test_each_subcommand_help_is_its_module_docstring_with_exit_codes(name, capsys):
    doc = importlib.import_module(f"tfdet._cli.{name}").__doc__
    summary = " ".join(doc.partition("\n\n")[0].split())
    assert _cli.main(["tfdet", name, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit codes: " in out and summary not in out
    assert _cli.main(["tfdet", "--help"]) == 0
    assert summary in " ".join(capsys.readouterr().out.split())


def test_version_prints_the_package_version(capsys):
    import tfdet

    assert _cli.main(["tfdet", "--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tfdet {tfdet.__version__}"


def test_json_dash_writes_the_report_to_stdout_with_the_version(
    tmp_path, capsys, monkeypatch
):
    import tfdet

    def report(args):
        _output.out("verdict: identical (exit 0)")
        _cli.write_json(args.json, {"verdict": "identical"})
        return 0

    monkeypatch.setattr(_output, "_human_to_stderr", False)
    assert _cli.execute(_namespace(report, json="-")) == 0
    captured = capsys.readouterr()
    assert "verdict: identical" in captured.err
    assert json.loads(captured.out) == {
        "verdict": "identical",
        "tfdet_version": tfdet.__version__,
    }
    assert not (tmp_path / "-").exists() and not os.path.exists("-")
    path = tmp_path / "report.json"
    assert _cli.execute(_namespace(report, json=str(path))) == 0
    assert json.loads(path.read_text())["tfdet_version"] == tfdet.__version__


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
)
def test_a_stop_signal_is_128_plus_its_number(signum, code):
    def stopped(args):
        raise _cli.Interrupted(signum)

    assert _cli.execute(_namespace(stopped)) == code


class _BrokenStream(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_output_to_a_reader_that_went_away_is_dropped_not_raised(monkeypatch):
    # Writes go to streams with no descriptor here, so nothing else is touched.
    monkeypatch.setattr(sys, "stdout", _BrokenStream())
    monkeypatch.setattr(sys, "stderr", _BrokenStream())
    assert _output.out("report") is False
    assert _output.err("error") is False
    _output.progress("  run 0: step 1/2")
    _output.flush_at_exit()


def test_a_closed_stdout_does_not_fail_the_command(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)  # What Python sets for `>&-`.
    monkeypatch.setattr(_output, "_human_to_stderr", False)

    def report(args):
        _output.out("verdict: identical (exit 0)")
        _cli.write_json(args.json, {"verdict": "identical"})
        return 0

    assert _cli.execute(_namespace(report, json="-")) == 0


def test_progress_that_would_block_is_dropped():
    # A pipe nobody reads: fill it, then a progress line must return at once
    # instead of waiting for a reader.
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(write_end, b"x" * 4096)
        os.set_blocking(write_end, True)
        stream = os.fdopen(write_end, "w", closefd=False)
        real = sys.stderr
        sys.stderr = stream
        try:
            _output.progress("  run 0: step 1/2")  # Would block forever if written.
        finally:
            sys.stderr = real
        # Returned, and the line was dropped: the pipe holds only the filler.
        os.set_blocking(read_end, False)
        held = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 65536):
                held += chunk
        assert held and set(held) == {ord("x")}
    finally:
        os.close(read_end)
        os.close(write_end)


# The positional arguments each subcommand needs to parse.
_POSITIONALS = {"diff": ["a.jsonl", "b.jsonl"]}


def _subcommands_with_json() -> list[str]:
    parser = _cli.build_parser()
    (subparsers,) = (
        action
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return [
        name
        for name, sub in subparsers.choices.items()
        if any("--json" in action.option_strings for action in sub._actions)
    ]


def test_every_subcommand_but_run_takes_json():
    assert set(_subcommands_with_json()) == set(_cli.SUBCOMMANDS) - {"run"}


@pytest.mark.parametrize("name", _subcommands_with_json())
@pytest.mark.parametrize("where", ["directory", "missing parent", "parent a file"])
def test_a_json_path_that_cannot_be_a_file_is_exit_2_before_any_work(
    name, where, tmp_path, monkeypatch, capsys
):
    # A directory passed the check before: `check` and `cost` did all their
    # work, then failed to write the report (exit 3, "its summary above
    # stands" with nothing printed); `env` printed, then exit 3.
    (tmp_path / "a file").write_text("kept")
    path = {
        "directory": tmp_path,
        "missing parent": tmp_path / "missing" / "report.json",
        "parent a file": tmp_path / "a file" / "report.json",
    }[where]
    ran = []
    module = importlib.import_module(f"tfdet._cli.{name}")
    monkeypatch.setattr(module, "execute", lambda args: ran.append(args) or 0)
    argv = ["tfdet", name, *_POSITIONALS.get(name, []), "--json", str(path)]
    assert _cli.main(argv) == 2
    assert ran == []
    err = capsys.readouterr().err
    assert (
        f"Expected --json to name a {'file' if where == 'directory' else 'writable file'}"
        in err
    ), err
    assert (tmp_path / "a file").read_text() == "kept"


def test_a_report_that_cannot_be_written_after_the_work_claims_no_summary(
    tmp_path, capsys
):
    path = tmp_path / "report.json"

    def work_then_report(args):
        path.mkdir()  # Made a directory while the work ran.
        _cli.write_json(args.json, {"verdict": "identical"})
        _output.out("verdict: identical (exit 0)")
        return 0

    assert _cli.execute(_namespace(work_then_report, json=str(path))) == 3
    err = capsys.readouterr().err
    assert "report was not written, so no verdict is given" in err, err
    assert "above stands" not in err
