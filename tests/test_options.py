"""`RunOptions`: every run option's default and validation, in one place."""

from __future__ import annotations

import dataclasses

import pytest

from tfdet._cli import as_flags
from tfdet._commands import _options
from tfdet._commands._options import RunOptions
from tfdet._errors import TargetError
from tfdet._pin import _settings
from tfdet._protocol import _perturb
from tfdet._target import _load


def test_defaults_are_stated_once_and_the_target_is_parsed():
    options = RunOptions()
    assert options.target == _load.TargetSpec("builtin:cnn")
    assert (options.runs, options.steps, options.timeout) == (2, 3, 600.0)
    assert (options.seed, options.threads, options.cpu_isa) == (
        _settings.DEFAULT_SEED,
        _settings.DEFAULT_THREADS,
        _settings.DEFAULT_CPU_ISA,
    )
    assert options.perturb == _perturb.ALL and options.device == "all"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.runs = 3  # type: ignore[misc]


def test_a_parsed_target_travels_unparsed():
    spec = _load.TargetSpec("builtin:cnn_tf_keras", legacy_keras=True)
    assert RunOptions(target=spec).target is spec


def test_lists_become_tuples_and_numbers_are_normalized():
    options = RunOptions(perturb=["hashseed"], timeout=5, threads=2)
    assert options.perturb == ("hashseed",) and options.timeout == 5.0
    assert options.threads == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"runs": 1}, "`runs` >= 2"),
        ({"runs": 2.0}, "`runs`"),
        ({"steps": 0}, "`steps` >= 1"),
        ({"device": "tpu"}, "`device`"),
        ({"perturb": ("gravity",)}, "`perturb`"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"threads": 0}, "threads"),
        ({"threads": 1025}, r"\[1, 1024\]"),
        ({"cpu_isa": "NOPE"}, "cpu_isa"),
        ({"timeout": 0}, "`timeout`"),
        ({"timeout": -1.0}, "`timeout`"),
        ({"timeout": float("nan")}, "`timeout`"),
        ({"timeout": float("inf")}, "`timeout`"),
        ({"timeout": 1e300}, "`timeout`"),
        ({"timeout": "soon"}, "`timeout`"),
        ({"enable": False, "threads": 2}, "`enable=False`"),
        ({"enable": "no"}, "enable"),
        ({"attribute": 1}, "attribute"),
        ({"traces": 3}, "`traces`"),
        ({"workers": 0}, "`workers`"),
        ({"workers": 65}, r"`workers` in \[1, 64\]"),
        ({"replicas": 0}, "`replicas`"),
        ({"replicas": 1.5}, "`replicas`"),
        ({"workers": 2, "replicas": 2}, "not both"),
        ({"workers": 2, "device": "gpu"}, "`device=cpu`"),
        ({"replicas": 2, "device": "gpu"}, "`device=cpu`"),
    ],
)
def test_bad_values_are_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        RunOptions(**fields)


@pytest.mark.parametrize(
    ("fields", "as_the_cli_says_it"),
    [
        ({"runs": 1}, "Expected --runs >= 2. Received: runs=1"),
        ({"enable": False, "threads": 2}, "Received: threads=2 with --no-enable"),
        ({"emulate_cpu": 3}, "Expected --emulate-cpu to name a QEMU CPU model"),
        ({"perturb": ("",)}, "Expected --perturb names from"),
        (
            {"workers": 2, "device": "gpu"},
            "Expected --device cpu (or all) with --workers or --replicas",
        ),
    ],
)
def test_python_callers_read_option_names_the_cli_reads_flags(
    fields, as_the_cli_says_it
):
    with pytest.raises(ValueError) as error:
        RunOptions(**fields)
    assert "--" not in str(error.value)
    assert as_the_cli_says_it in as_flags(str(error.value))


def test_a_bad_target_is_a_target_error():
    with pytest.raises(TargetError):
        RunOptions(target="no-colon")


def test_check_timeout_accepts_finite_positive_numbers():
    assert _options.check_timeout(0.5) == 0.5
    assert _options.check_timeout(20) == 20.0
    with pytest.raises(ValueError):
        _options.check_timeout(True)
