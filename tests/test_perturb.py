"""Perturbation plans: every non-baseline run differs in every perturbation."""

from __future__ import annotations

import pytest

from tfdet._runs import _perturb


def test_parse_accepts_all_none_and_lists():
    assert _perturb.parse("all") == list(_perturb.ALL)
    assert _perturb.parse("none") == []
    assert _perturb.parse("isa, hashseed") == ["isa", "hashseed"]
    with pytest.raises(ValueError, match="gravity"):
        _perturb.parse("isa,gravity")


def test_every_run_after_the_baseline_differs_in_each_applied_perturbation():
    setups = _perturb.plan(3, list(_perturb.ALL))
    applied = set(_perturb.ALL) - set(_perturb.skipped(list(_perturb.ALL)))
    for setup in setups[1:]:
        for name in applied - {"neighbour"}:
            assert setup.labels[name] != setups[0].labels[name]
    # One neighbour is enough: it slows every run that shares the CPUs.
    assert [s.neighbour for s in setups] == [False, False, "neighbour" in applied]


def test_isa_preset_is_never_below_the_pinned_cap():
    from tfdet._pin import _isa

    for setup in _perturb.plan(4, ["isa"]):
        cap = setup.env.get(_isa.ENV_VAR)
        if cap is not None:
            assert _isa.rank(cap) >= _isa.rank("AVX2")


def test_single_perturbation_setup_keeps_the_baseline_otherwise():
    base, other = _perturb.plan(2, ["hashseed", "stagger"])
    mixed = base.with_perturbation_of(other, "hashseed", 9)
    assert mixed.env["PYTHONHASHSEED"] == other.env["PYTHONHASHSEED"]
    assert mixed.delay == base.delay and mixed.index == 9
    assert base.with_perturbation_of(other, None, 10).labels == base.labels
