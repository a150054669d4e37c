"""Perturbation plans: every non-baseline run differs in every perturbation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import check_options, clean_env, run_tfdet
from tfdet._pin import _cpus, _isa
from tfdet._protocol import _perturb, _spec
from tfdet._protocol._result import WorkerResult
from tfdet._runner import _outcome, _spawn

AVX512_SERVER = frozenset(
    {"sse4_1", "avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
)


def test_parse_accepts_all_none_and_lists():
    assert _perturb.parse("all") == list(_perturb.ALL)
    assert _perturb.parse(None) == list(_perturb.ALL)
    assert _perturb.parse("none") == []
    assert _perturb.parse("isa, hashseed") == ["isa", "hashseed"]
    assert _perturb.parse("threads") == ["threads"]
    with pytest.raises(ValueError, match="gravity"):
        _perturb.parse("isa,gravity")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "an empty name"),
        ("  ", "an empty name"),
        ("isa,,hashseed", "an empty name"),
        ("affinity,", "an empty name"),
        ("affinity,affinity", "affinity repeated"),
        ("affinity,affinity,none", "'none' alone"),
        ("none,isa", "'none' alone"),
        ("all,threads", "'all' alone"),
    ],
)
def test_parse_rejects_empty_repeated_and_mixed_names(text: str, message: str):
    with pytest.raises(ValueError, match="`perturb`") as error:
        _perturb.parse(text)
    assert message in str(error.value)


def test_validate_takes_the_parsed_tuple_back():
    # check() re-validates options.perturb, which is () for --perturb none.
    assert _perturb.validate(()) == []
    assert _perturb.validate(("threads", "isa")) == ["threads", "isa"]
    with pytest.raises(ValueError, match="repeated"):
        _perturb.validate(("isa", "isa"))


def test_threads_emulation_and_interrupt_are_opt_in_and_everything_is_described():
    opt_in = {"threads", "emulated_cpu", "interrupt", "migrate", "batch"}
    assert not opt_in & set(_perturb.ALL)
    assert set(_perturb.KNOWN) == set(_perturb.ALL) | opt_in
    assert set(_perturb.DESCRIPTIONS) == set(_perturb.KNOWN)
    assert set(_perturb.IMITATED) == set(_perturb.KNOWN)
    assert {"cpu_vendor", "microarchitecture", "cache_sizes_elsewhere"} <= set(
        _perturb.NOT_IMITATED
    )
    for sentence in [*_perturb.IMITATED.values(), *_perturb.NOT_IMITATED.values()]:
        assert sentence.endswith(".")


def test_every_run_after_the_baseline_differs_in_each_applied_perturbation():
    setups = check_options(runs=3).plan().setups
    applied = set(_perturb.ALL) - set(check_options().plan().skipped)
    for setup in setups[1:]:
        for name in applied - {"neighbour"}:
            assert setup.labels[name] != setups[0].labels[name]
    # One neighbour is enough: it slows every run that shares the CPUs.
    assert [s.neighbour for s in setups] == [False, False, "neighbour" in applied]


def test_isa_preset_under_a_pinned_cap_is_not_applicable_and_never_set():
    # With the cap pinned, a preset above it is overridden and one below it is
    # another profile: no preset may be planned, and the report says why.
    reason = check_options(perturb=("isa",)).plan().skipped["isa"]
    if _isa.applies():
        assert reason.startswith("not applicable: the profile pins")
    for setup in check_options(runs=4, perturb=("isa",)).plan().setups:
        assert _isa.ONEDNN_ISA_VARIABLE not in setup.env
        assert "isa" not in setup.labels


def _avx512_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_isa, "applies", lambda: True)
    monkeypatch.setattr(_isa, "cpu_flags", lambda: AVX512_SERVER)


def test_isa_presets_without_a_pinned_cap_lower_the_isa_in_force(monkeypatch):
    _avx512_server(monkeypatch)
    assert check_options(perturb=("isa",), cpu_isa=None).plan().skipped == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    base, *others = check_options(runs=4, perturb=("isa",), cpu_isa=None).plan().setups
    assert base.env[_isa.ONEDNN_ISA_VARIABLE] is None
    assert base.env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert others[0].env[_isa.ONEDNN_ISA_VARIABLE] == "AVX2"
    # XLA:CPU's generated code gets the same older generation's ISA.
    assert others[0].env["XLA_FLAGS"] == (
        "--xla_cpu_enable_fast_math=false --xla_cpu_max_isa=AVX2"
    )
    isolated = base.with_perturbation_of(others[0], "isa", 1)
    assert isolated.env["XLA_FLAGS"] == others[0].env["XLA_FLAGS"]
    for setup in others:
        cap = setup.env[_isa.ONEDNN_ISA_VARIABLE]
        # Really below the CPU's best: the preset changes the ISA in force.
        assert _isa.rank("AVX2") <= _isa.rank(cap) < _isa.rank("AVX512_CORE")
        assert _isa.in_force(cap, AVX512_SERVER) != _isa.in_force(None, AVX512_SERVER)
    # "ALL" pins nothing either.
    assert check_options(perturb=("isa",), cpu_isa="ALL").plan().skipped == {}


def test_isa_on_an_avx2_cpu_without_a_cap_has_nothing_to_lower(monkeypatch):
    monkeypatch.setattr(_isa, "applies", lambda: True)
    monkeypatch.setattr(_isa, "cpu_flags", lambda: frozenset({"sse4_1", "avx", "avx2"}))
    assert (
        "nothing above AVX2"
        in check_options(perturb=("isa",), cpu_isa=None).plan().skipped["isa"]
    )


@pytest.mark.parametrize(("profile", "other"), [(None, 3), (1, 3), (2, 3), (4, 1)])
def test_threads_gives_the_other_runs_another_pool_size(profile, other):
    base, *others = (
        check_options(
            runs=3, perturb=("threads",), **({"threads": profile} if profile else {})
        )
        .plan()
        .setups
    )
    assert base.threads is None
    assert base.env["TF_NUM_INTRAOP_THREADS"] is None
    for setup in others:
        assert setup.threads == other
        assert setup.env["TF_NUM_INTRAOP_THREADS"] == str(other)
        assert setup.env["TF_NUM_INTEROP_THREADS"] == str(other)
        assert "not another machine" in setup.labels["threads"]
    mixed = base.with_perturbation_of(others[0], "threads", 7)
    assert (
        mixed.threads == other
        and mixed.labels["threads"] == others[0].labels["threads"]
    )
    assert base.with_perturbation_of(others[0], "hashseed", 8).threads is None


def test_single_perturbation_setup_keeps_the_baseline_otherwise():
    base, other = check_options(perturb=("hashseed", "stagger")).plan().setups
    mixed = base.with_perturbation_of(other, "hashseed", 9)
    assert mixed.env["PYTHONHASHSEED"] == other.env["PYTHONHASHSEED"]
    assert mixed.delay == base.delay and mixed.index == 9
    assert base.with_perturbation_of(other, None, 10).labels == base.labels


def test_spawner_puts_the_threads_override_into_the_worker_spec(tmp_path: Path):
    # A stand-in worker that writes back the spec it was given (beside its
    # result, which a preflight child's is: nothing of its own).
    (tmp_path / "echo_worker.py").write_text(
        "import json, sys\n"
        "spec = json.loads(sys.argv[1])\n"
        "json.dump(spec, open(spec['result'] + '.seen', 'w'))\n"
        "json.dump({}, open(spec['result'], 'w'))\n"
    )
    env = clean_env(PYTHONPATH=str(tmp_path))
    setups = check_options(perturb=("threads",)).plan().setups
    outcomes = _spawn.run_all(
        setups,
        _spec.WorkerSpec(_spec.PREFLIGHT, threads=1),
        str(tmp_path),
        module="echo_worker",
        base_env=env,
        timeout=120.0,
    )
    assert [o.ok for o in outcomes] == [True, True], outcomes
    assert [_seen(tmp_path, o)["threads"] for o in outcomes] == [1, 3]


def _seen(directory: Path, outcome: _outcome.RunOutcome) -> dict:
    """What a stand-in worker of `outcome`'s run saw (it writes it down)."""
    return json.loads((directory / f"run{outcome.setup.index}.json.seen").read_text())


def test_check_perturb_threads_pins_another_pool_in_the_other_run(tmp_path: Path):
    report_path = tmp_path / "report.json"
    result = run_tfdet(
        "check",
        "builtin:embedding",
        "--steps",
        "1",
        "--perturb",
        "threads",
        "--device",
        "cpu",
        "--json",
        str(report_path),
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    runs = json.loads(report_path.read_text())["devices"]["cpu"]["runs"]
    # The baseline's pool is the CPUs each process may use (the default).
    baseline = _cpus.usable_cpus()
    expected_other = 3 if baseline < 3 else 1
    assert [run["profile"]["intra_op_threads"] for run in runs] == [
        baseline,
        expected_other,
    ]


@pytest.mark.parametrize("value", ["", "affinity,affinity,none"])
def test_cli_rejects_bad_perturb_values_with_exit_2(value: str):
    result = run_tfdet("check", "--perturb", value, "--steps", "1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--perturb" in result.stderr


def test_an_emulated_run_is_reported_as_emulated_not_imitated():
    sections = _perturb.imitation_sections(["affinity", "emulated_cpu"], "Haswell-v4")
    assert set(sections["imitated"]) == {"affinity"}
    assert (
        "user-mode emulation of a Haswell-v4 CPU"
        in sections["emulated"]["emulated_cpu"]
    )
    # What the emulated run stood for leaves `not_imitated`; what it did not
    # (a vendor's own hardware) is said instead.
    assert "cpu_vendor" not in sections["not_imitated"]
    assert "approximate_instructions" not in sections["not_imitated"]
    assert "vendor_hardware" in sections["not_imitated"]
    without = _perturb.imitation_sections(["affinity"], None)
    assert without["emulated"] == {}
    assert "emulated_cpu" in without["not_imitated"]["cpu_vendor"]


def test_a_setting_or_a_preemption_is_varied_never_an_imitated_machine():
    sections = _perturb.imitation_sections(
        ["caches", "threads", "interrupt", "batch"], None
    )
    assert set(sections["imitated"]) == {"caches"}
    assert set(sections["varied"]) == {"threads", "interrupt", "batch"}
    assert _perturb.imitation_sections(["caches"], None)["varied"] == {}


def test_an_emulated_run_gets_the_emulator_in_front_and_more_time():
    context = _perturb.Context(2, "AVX2", 1, "Haswell-v4")
    record = _perturb.REGISTRY["emulated_cpu"]
    caches = _perturb.REGISTRY["caches"]
    native = _perturb.setup_of(0, [record, caches], context)
    emulated = _perturb.setup_of(1, [record, caches], context)
    assert native.launcher == () and native.slowdown == 1.0
    assert emulated.launcher[1:] == ("-cpu", "Haswell-v4")
    assert emulated.slowdown > 1
    # The emulated CPU reports its own cache sizes: no imitation on top.
    assert emulated.changes["caches"].env == {}
    assert not emulated.changes["caches"].by_child
    assert emulated.confirmed_by_child == ["emulated_cpu"]


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"steps": 1}, "needs 2 steps"),
        ({"steps": 4, "workers": 2}, "not for `workers`"),
        ({"steps": 4, "target": "builtin:cnn_tf_keras"}, "not for tf_keras"),
        ({"steps": 4}, None),
    ],
)
def test_interrupt_applies_to_single_process_keras3_runs_of_two_steps(options, reason):
    from tfdet._commands import _options

    run_options = _options.RunOptions(perturb=("interrupt",), **options)
    skipped = run_options.plan().skipped.get("interrupt")
    assert (skipped is None) if reason is None else reason in skipped
    if reason is None:
        base, other = run_options.plan().setups
        assert not base.resumes and other.resumes
        assert other.env["TFDET_INTERRUPT_AFTER"] == "2"
        resumed = other.resumed_on
        assert resumed.env["TFDET_INTERRUPT_AFTER"] is None
        assert resumed.env["TFDET_RESUMED_AFTER"] == "2"
        assert resumed.labels == other.labels and base.resumed_on is base


def test_the_resumed_process_learns_how_far_the_killed_one_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from tfdet._child import _start

    spec = _spec.WorkerSpec(_spec.SCRIPT, result=str(tmp_path / "run1.json"))
    # Not a resumed process: nothing is read or set.
    monkeypatch.delenv("TFDET_RESUMED_AFTER", raising=False)
    _start._resume_where_killed(spec)
    assert _spec.resumed_after() is None
    # Resumed, but the killed process left no file: the steps asked stay.
    monkeypatch.setenv("TFDET_RESUMED_AFTER", "2")
    _start._resume_where_killed(spec)
    assert _spec.resumed_after() == 2
    # A script is killed after the first backup past the steps asked.
    (tmp_path / ("run1.json" + _spec.KILLED_SUFFIX)).write_text("5")
    _start._resume_where_killed(spec)
    assert _spec.resumed_after() == 5


_KILLED_THEN_RESUMED = """
import json, os, signal, sys
spec = json.loads(sys.argv[1])
seen = {"threads": spec["threads"], "hashseed": os.environ.get("PYTHONHASHSEED")}
if os.environ.get("TFDET_INTERRUPT_AFTER"):  # The process to kill.
    json.dump(seen, open(spec["result"] + ".killed", "w"))
    os.kill(os.getpid(), signal.SIGKILL)
resumed = os.environ.get("TFDET_RESUMED_AFTER")
applied = {"migrate": "resumed"} if resumed else {}
json.dump(seen, open(spec["result"] + ".seen", "w"))
json.dump({"perturbations_applied": applied}, open(spec["result"], "w"))
"""


def test_migrate_kills_the_run_unperturbed_and_resumes_it_under_the_others(
    tmp_path: Path,
):
    # A stand-in worker that says what each of its processes was given.
    (tmp_path / "moving_worker.py").write_text(_KILLED_THEN_RESUMED)
    env = clean_env(PYTHONPATH=str(tmp_path), PYTHONHASHSEED="0")
    setups = check_options(perturb=("migrate", "threads", "hashseed")).plan().setups
    assert setups[1].resuming == "migrate"
    assert set(setups[1].killed_on.changes) == {"migrate"}
    assert setups[0].killed_on is setups[0]
    outcomes = _spawn.run_all(
        setups,
        _spec.WorkerSpec(_spec.PREFLIGHT, threads=1),
        str(tmp_path),
        module="moving_worker",
        base_env=env,
        timeout=120.0,
    )
    assert [o.ok for o in outcomes] == [True, True], outcomes
    assert [o.interrupted for o in outcomes] == [None, True]
    killed = json.loads((tmp_path / "run1.json.killed").read_text())
    # Before the move: this machine's (the profile's pool, the parent's seed).
    assert killed == {"threads": 1, "hashseed": "0"}
    # After it: the run's other perturbations.
    resumed = _seen(tmp_path, outcomes[1])
    assert resumed["threads"] == 3
    assert resumed["hashseed"] == setups[1].env["PYTHONHASHSEED"] != "0"
    assert _seen(tmp_path, outcomes[0])["threads"] == 1


def test_migrate_alone_says_it_resumes_on_the_same_machine_and_replaces_interrupt():
    alone = check_options(perturb=("migrate",)).plan().setups[1]
    assert "on the same machine" in alone.labels["migrate"]
    both = check_options(perturb=("interrupt", "migrate", "hashseed")).plan().setups[1]
    # One kill, one resume: migrate's.
    assert both.resuming == "migrate" and not both.changes["interrupt"].resumes
    assert set(both.killed_on.changes) == {"migrate"}


def test_a_migrate_run_that_was_never_killed_never_moved():
    setup = check_options(perturb=("migrate", "hashseed")).plan().setups[1]
    outcome = _outcome.RunOutcome(
        setup, 0, WorkerResult(), "", False, 1.0, interrupted=False
    )
    assert set(outcome.unapplied) == {"migrate", "hashseed"}
    assert "never moved" in outcome.not_applied["hashseed"]
    # A reason given for a perturbation the run did not have is not its own.
    other = _outcome.RunOutcome(
        check_options(perturb=("interrupt",)).plan().setups[1],
        0,
        WorkerResult(
            perturbations_not_applied={"interrupt": "no backup", "migrate": "x"}
        ),
        "",
        False,
        1.0,
        interrupted=False,
    )
    assert other.unapplied == {"interrupt": "no backup"}


def test_an_emulated_run_says_it_is_allowed_ten_times_the_timeout():
    # The emulated run's longer time bound was applied but never said.
    context = _perturb.Context(
        runs=2, pinned_isa="AVX2", threads=1, emulated_model="Haswell-v4"
    )
    change = _perturb.REGISTRY["emulated_cpu"].change(1, context)
    assert change.slowdown == 10.0
    assert "allowed 10x `timeout`" in change.label
    # The CLI's reports say it as the flag.
    from tfdet._cli import as_flags

    assert "allowed 10x --timeout," in as_flags(change.label)


@pytest.mark.parametrize(
    ("options", "kind", "reason"),
    [
        ({}, _spec.CHECK, None),
        ({"workers": 2}, _spec.CHECK, "not for `workers`"),
        ({}, _spec.LOCATE, "compares training steps"),
        ({}, _spec.SCRIPT, "a script predicts what it chooses"),
    ],
)
def test_batch_applies_to_the_runs_of_a_target(options, kind, reason):
    from tfdet._commands import _options

    run_options = _options.RunOptions(perturb=("batch",), **options)
    skipped = run_options.plan(kind).skipped.get("batch")
    assert (skipped is None) if reason is None else reason in skipped
    if reason is None:
        base, other = run_options.plan().setups
        # Both runs predict; only the other one in other batches, confirmed.
        assert base.env["TFDET_PREDICT"] == "whole"
        assert other.env["TFDET_PREDICT"] == "split"
        assert other.confirmed_by_child == ["batch"]
        assert base.confirmed_by_child == []
