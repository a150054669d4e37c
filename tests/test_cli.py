"""The CLI's one place that maps outcomes to exit codes."""

from __future__ import annotations

import argparse

from tfdet import _cli
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
