"""The pinned settings' defaults and validation shared by enable(), the CLI
and `RunOptions`."""

from __future__ import annotations

import numpy as np
import pytest

from tfdet._pin import _isa, _settings
from tfdet._setup import _enable


def test_enable_uses_these_defaults():
    import inspect

    parameters = inspect.signature(_enable.enable).parameters
    assert parameters["seed"].default == _settings.DEFAULT_SEED
    assert parameters["threads"].default == _settings.DEFAULT_THREADS
    assert parameters["cpu_isa"].default == _settings.DEFAULT_CPU_ISA


def test_check_int_takes_any_integer_type_and_refuses_others():
    assert _settings.check_int("n", np.int64(3), 0, 5) == 3
    assert type(_settings.check_int("n", np.int64(3), 0, 5)) is int
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match=r"Expected `n` to be an int"):
            _settings.check_int("n", bad, 0, None)
    with pytest.raises(ValueError, match=r"Expected `n` in \[0, 5\]. Received: n=6"):
        _settings.check_int("n", 6, 0, 5)
    with pytest.raises(ValueError, match=r"Expected `n` >= 1"):
        _settings.check_int("n", 0, 1, None)


def test_seed_and_threads_bounds():
    assert _settings.check_seed(_settings.MAX_SEED) == 2**32 - 1
    assert _settings.check_threads(_settings.MAX_THREADS) == 1024
    with pytest.raises(ValueError, match="seed"):
        _settings.check_seed(2**32)
    with pytest.raises(ValueError, match="threads"):
        _settings.check_threads(10000)


def test_check_settings_normalizes_all_three():
    seed, threads, cpu_isa = _settings.check_settings(np.int32(4), 2, "avx2")
    assert (seed, threads) == (4, 2)
    assert cpu_isa == (_isa.normalize("avx2"))
    assert _settings.check_settings(0, 1, None)[2] is None
    with pytest.raises(ValueError, match="cpu_isa"):
        _settings.check_settings(0, 1, "NOT_AN_ISA")
