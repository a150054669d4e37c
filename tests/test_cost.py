"""`tfdet cost`: every setting timed side by side, what its bits follow, the
ops that grew, one recommendation; and the same ratio as the benchmark's."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import pytest

from tests.conftest import (
    PLOT_PACKAGE_PATHS,
    REPO,
    clean_env,
    run_tfdet,
)
from tfdet._child import _ops
from tfdet._cost import _advice, _cost_report, _measure
from tfdet._cost._timed_settings import (
    OP_DETERMINISM,
    PLAIN,
    XLA,
    Setting,
    bits_follow,
    gpu_settings_for,
    kernel_patches,
    not_as_asked,
    settings_for,
    tiers,
)
from tfdet._pin import _devices, _tiers
from tfdet._pin._profile import Profile
from tfdet._pin._tiers import POOL_SIZE_FREE
from tfdet._setup import _coverage

# --- The per-op times, from a profiler trace written here -------------------


def _write_trace(directory, events: list[tuple[str, float]]) -> None:
    """A profiler trace as TensorFlow writes it: events of `(name, ms)` on
    two threads of the host plane."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for index, (name, _) in enumerate(events):
        plane.event_metadata[index + 1].name = name
    lines = [plane.lines.add(name=f"tf_Compute/{k}") for k in range(2)]
    for index, (_, ms) in enumerate(events):
        event = lines[index % 2].events.add(metadata_id=index + 1)
        event.duration_ps = int(ms * 1e9)
    path = directory / "plugins" / "profile" / "run" / "host.xplane.pb"
    path.parent.mkdir(parents=True)
    path.write_bytes(space.SerializeToString())


def test_op_times_are_summed_per_op_type_per_step(tmp_path):
    conv = "gradient_tape/seq/conv2d/convolution/Conv2DBackpropFilter"
    replaced = "gradient_tape/seq/conv2d/convolution/PoolSizeFreeConv2DBackpropFilter"
    _write_trace(
        tmp_path,
        [
            (f"{conv}:_MklNativeConv2DBackpropFilterWithBias", 6.0),
            ("seq/conv2d/Relu:_MklNativeFusedConv2D", 2.0),
            ("seq/conv2d_1/Relu:_MklNativeFusedConv2D", 4.0),
            ("seq/dense/MatMul:MatMul", 1.0),
            # A replacement's inner ops count as the replacement.
            (f"{replaced}/transpose:Transpose", 3.0),
            (f"{replaced}/Conv2D:Conv2D", 5.0),
            # Enclosing events and runtime events are not ops of their own.
            ("StatefulPartitionedCall:StatefulPartitionedCall", 100.0),
            ("EagerLocalExecute: __inference_one_step_on_data_17", 100.0),
            ("ExecutorState::Process", 100.0),
        ],
    )
    ops = _ops.per_op_type(str(tmp_path), steps=2)
    assert ops == {
        "Conv2DBackpropFilterWithBias": {"ms": 3.0, "node": conv},
        "FusedConv2D": {"ms": 3.0, "node": "seq/conv2d_1/Relu"},
        "MatMul": {"ms": 0.5, "node": "seq/dense/MatMul"},
        "PoolSizeFreeConv2DBackpropFilter": {"ms": 4.0, "node": replaced},
    }


def test_a_replacement_used_many_times_is_one_op(tmp_path):
    # TensorFlow makes a name scope used again unique with a suffix.
    scope = "gradient_tape/seq/conv2d/convolution"
    _write_trace(
        tmp_path,
        [
            ("seq/conv2d/PoolSizeFreeConv2D/Conv2D:Conv2D", 1.0),
            ("seq/conv2d_1/PoolSizeFreeConv2D_1/Conv2D:Conv2D", 2.0),
            (f"{scope}/PoolSizeFreeConv2D_21/concat:ConcatV2", 4.0),
            ("seq/dense/PoolSizeFreeMatMul_3/Conv2D:Conv2D", 1.0),
        ],
    )
    assert _ops.per_op_type(str(tmp_path), steps=1) == {
        "PoolSizeFreeConv2D": {"ms": 7.0, "node": f"{scope}/PoolSizeFreeConv2D_21"},
        "PoolSizeFreeMatMul": {"ms": 1.0, "node": "seq/dense/PoolSizeFreeMatMul_3"},
    }


def test_no_trace_is_an_error_not_an_empty_profile(tmp_path):
    with pytest.raises(FileNotFoundError, match="profiler trace"):
        _ops.per_op_type(str(tmp_path), steps=1)


def test_op_shares_add_up_to_the_measured_step():
    # Two inter-op threads overlap: 30 ms of ops in a 20 ms step.
    shares = _measure._shares(
        {"A": {"ms": 20.0, "node": "a"}, "B": {"ms": 10.0, "node": "b"}}, 20.0
    )
    assert shares == {
        "A": {"ms": pytest.approx(40 / 3), "node": "a"},
        "B": {"ms": pytest.approx(20 / 3), "node": "b"},
    }
    assert _measure._shares({}, 20.0) == {}


# --- What each profile ties the bits to --------------------------------------


def _profile(**fields) -> dict:
    return {
        "intra_op_threads": 1,
        "cpu_isa": "AVX2",
        "xla_cpu_isa": "AVX2",
        "patches": ["portable_erfc"],
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "xla", "follow"),
    [
        ({}, False, []),
        ({"intra_op_threads": 0, "cpu_isa": "ALL"}, False,
         ["the core count", "the CPU's instruction set"]),
        ({"intra_op_threads": 4}, False, ["4 threads"]),
        ({"intra_op_threads": 4, "patches": [POOL_SIZE_FREE]}, False, []),
        ({"xla_cpu_isa": "none (TensorFlow < 2.19 has no cap)"}, False, []),
        ({"xla_cpu_isa": "none (TensorFlow < 2.19 has no cap)"}, True,
         ["the CPU's instruction set (XLA:CPU)"]),
    ],
    ids=["default", "plain", "threads", "pool-size-free", "xla-unused", "xla"],
)  # fmt: skip
def test_what_the_bits_follow_comes_from_the_profile(fields, xla, follow):
    assert bits_follow(_profile(**fields), xla) == follow


def test_an_op_the_pool_size_free_products_leave_takes_their_thread_tiers_away():
    # MobileNetV2 under the pool-size-free products at 16 threads, before
    # they covered its depthwise filter gradient: its profile promised any
    # thread count, its steps ran TensorFlow's op, and its weights followed
    # the pool. The row says so from the ops its steps ran.
    profile = _profile(
        op_determinism=True,
        intra_op_threads=16,
        patches=["auto", POOL_SIZE_FREE],
        tensorflow_version="2.21.0",
    )
    ran = {"DepthwiseConv2dNativeBackpropFilter": {}, "Conv2D": {}, "Mul": {}}
    left = _coverage.of(profile, ran)
    assert [op.op for op in left.uncovered] == ["DepthwiseConv2dNativeBackpropFilter"]
    assert bits_follow(profile, False, "cpu", left) == [
        "16 threads (through DepthwiseConv2dNativeBackpropFilter)"
    ]
    assert tiers(profile, False, "cpu", left) == ["this-machine", "any-batch"]
    # The ops the patch replaces did not run: the profile's tiers stand.
    replaced = {"PoolSizeFreeBiasAddGrad": {}, "TfdetFixedOrderMatMul": {}}
    assert _coverage.of(profile, replaced).lost == ()
    assert tiers(profile, False) == [
        "this-machine", "any-thread-count", "any-x86-cpu", "any-batch"
    ]  # fmt: skip
    # One thread, or bits that follow the pool by the profile: nothing to add.
    assert _coverage.of({**profile, "intra_op_threads": 1}, ran).lost == ()
    assert _coverage.of({**profile, "patches": ["auto"]}, ran).lost == ()


@pytest.mark.parametrize(
    ("fields", "xla", "tiers"),
    [
        ({}, False, ["this-machine", "any-thread-count", "any-x86-cpu"]),
        ({"op_determinism": False, "intra_op_threads": 0, "cpu_isa": "ALL"}, False, []),
        ({"intra_op_threads": 4}, False, ["this-machine"]),
        ({"intra_op_threads": 4, "cpu_isa": "ALL"}, False, ["this-machine"]),
        ({"intra_op_threads": 4, "patches": [POOL_SIZE_FREE]}, False,
         ["this-machine", "any-thread-count", "any-x86-cpu", "any-batch"]),
        ({"patches": [POOL_SIZE_FREE], "cpu_isa": "ALL"}, False,
         ["this-machine", "any-thread-count", "any-batch"]),
        ({"xla_cpu_isa": "none (TensorFlow < 2.19 has no cap)"}, True,
         ["this-machine", "any-thread-count"]),
    ],
    ids=["default", "plain", "threads", "native", "pool-size-free",
         "pool-size-free-native", "xla-uncapped"],
)  # fmt: skip
def test_the_tiers_come_from_the_profile(fields, xla, tiers):
    profile = _profile(**{"op_determinism": True, **fields})
    assert [tier.name for tier in _tiers.given(profile, xla)] == tiers
    # The same vocabulary on the Profile enable() returns.
    full = Profile.from_dict(
        {**profile, "seed": 0, "inter_op_threads": 1, "onednn_opts": True,
         "xla_determinism": False, "python_hash_seed": "0", "keras": "keras3",
         "tensorflow_version": "2.21.0", "keras_version": "3.12.0",
         "numpy_version": "2.1.0", "python_version": "3.11.0"}
    )  # fmt: skip
    assert list(full.tiers(xla)) == tiers
    # On a GPU, XLA needs its deterministic ops flag (False here).
    gpu = ["same-gpu"] if tiers and not xla else []
    assert list(full.tiers(xla, device="gpu")) == gpu


def test_the_settings_a_user_would_try_are_timed():
    names = [setting.name for setting in settings_for(4)]
    assert names == [
        "plain TensorFlow",
        "enable()",
        "enable(threads=1)",
        "enable(cpu_isa=None)",
        "enable() + jit_compile=True",
    ]
    assert settings_for(4)[2].enable == {"threads": 1}
    assert settings_for(4)[3].enable == {"cpu_isa": None}
    # One core: one thread is the default's pool, so that row goes.
    assert [setting.enable for setting in settings_for(1, xla=False)] == [
        None,
        {},
        {"cpu_isa": None},
    ]


def test_a_row_whose_kernels_did_not_load_says_so_and_is_not_advised():
    default = settings_for(4)[1]
    # The default asks for every kernel "auto" installs on this TensorFlow.
    asked = ["auto", *kernel_patches()]
    loaded = _profile(patches=asked, kernels=list(kernel_patches()))
    assert not_as_asked(default, loaded, xla=False) is None
    # None shipped, no compiler and no cached build: the compositions.
    fell_back = _profile(patches=asked, kernels=[])
    note = not_as_asked(default, fell_back, xla=False)
    assert note.startswith(
        f"tfdet's kernels did not load for {', '.join(kernel_patches())} ("
    )
    assert kernel_patches()[:2] == ("fixed_order_products", "fixed_order_convolutions")
    assert note.endswith("timed with the compositions")
    # A list without kernels asks for none; plain TensorFlow for nothing; a
    # profile from before the field (None) cannot show them loaded.
    composition = Setting("compositions", {"patches": ["auto", POOL_SIZE_FREE]})
    assert not_as_asked(composition, fell_back, xla=False) is None
    assert not_as_asked(settings_for(4)[0], None, xla=False) is None
    assert not_as_asked(default, _profile(patches=asked), xla=False) is not None
    # XLA that Keras turned off is said first, as before.
    assert not_as_asked(XLA, _profile(), xla=False).startswith("Keras turned")
    row = _row("kernels", 0.5, note=note)
    assert row not in _cost(row).candidates()


def test_the_settings_a_gpu_user_would_try_are_timed():
    names = [setting.name for setting in gpu_settings_for(4)]
    assert names == [
        "plain TensorFlow",
        "enable()",  # First of the deterministic ones: preferred on a tie.
        "seeds + enable_op_determinism()",
        "enable(threads=1)",
        "enable() + jit_compile=True",
    ]
    # TensorFlow's own switch, without tfdet.
    assert OP_DETERMINISM.enable is None and OP_DETERMINISM.op_determinism
    assert [setting.name for setting in gpu_settings_for(1, xla=False)] == names[:3]
    # A GPU run's bits follow the GPU, whatever its profile.
    assert bits_follow(_profile(), False, "gpu") == ["the GPU model and its software"]


# --- The recommendation -------------------------------------------------------

# The tiers of each setting `tfdet cost` times, as their profiles give them.
_ENABLE = ("this-machine", "any-thread-count", "any-x86-cpu")
_POOL_SIZE_FREE = (*_ENABLE, "any-batch")
_THIS_MACHINE = ("this-machine",)


def _row(name: str, ratio: float, follow: tuple[str, ...] = (), **extra):
    return _cost_report.CostRow(
        setting=Setting(name, None if name == PLAIN.name else {}),
        ms_per_step=10 * ratio,
        ratio=ratio,
        ratio_q1=ratio,
        ratio_q3=ratio,
        xla=False,
        bits_follow=follow,
        digests=("d",),
        ops=extra.pop("ops", {}),
        tiers=extra.pop("tiers", () if follow else _ENABLE),
        **extra,
    )


def _cost(*rows) -> _cost_report.CostReport:
    return _cost_report.CostReport(
        target="builtin:cnn",
        cores=2,
        cpu_model="a CPU",
        rounds=1,
        blocks=4,
        steps=5,
        warmup=3,
        rows=(_row(PLAIN.name, 1.0, ("the core count",), tiers=()), *rows),
    )


def _from_blocks(
    ratios: dict[str, list[float]], tiers: dict[str, tuple[str, ...]], **report
) -> _cost_report.CostReport:
    """A report whose figures come from fixed block times: per setting, its
    time per step over plain TensorFlow's (100 ms) in each block."""
    per_block = [
        {PLAIN.name: 100.0, **{name: 100.0 * r[k] for name, r in ratios.items()}}
        for k in range(len(next(iter(ratios.values()))))
    ]
    rows = [
        dataclasses.replace(
            _row(name, 1.0, tiers=tiers.get(name, ())),
            **dataclasses.asdict(_measure.block_figures(per_block, name, PLAIN.name)),
        )
        for name in [PLAIN.name, *ratios]
    ]
    return dataclasses.replace(
        _cost(), rows=tuple(rows), per_block=tuple(per_block), **report
    )


# Two measurements on a shared 2-core Xeon (issue 50), as block times: the
# medians and middle halves are the ones `tfdet cost` printed. The old rule
# (keep enable() when the middle halves overlap) advised enable() for both.
_RESNET50 = {  # enable() 2.18x (2.09-3.44), pool-size-free 0.96x (0.78-3.22).
    "enable()": [2.27, 2.00, 3.44, 2.09],
    "pool-size-free": [0.70, 3.22, 0.78, 1.14],  # A neighbour's load in block 2.
}
_TRANSFORMER = {  # enable() 4.37x (3.82-5.71), pool-size-free 1.90x (1.06-3.87).
    "enable()": [3.50, 3.82, 4.92, 5.71],
    "pool-size-free": [1.00, 1.06, 2.74, 3.87],
}
_TIERS = {"enable()": _ENABLE, "pool-size-free": _POOL_SIZE_FREE}


def test_the_figures_are_those_the_noisy_machine_printed():
    for case, figures in [
        (_RESNET50, {"enable()": (2.18, 2.09, 3.44), "pool-size-free": (0.96, 0.78, 3.22)}),
        (_TRANSFORMER, {"enable()": (4.37, 3.82, 5.71), "pool-size-free": (1.90, 1.06, 3.87)}),
    ]:  # fmt: skip
        rows = {row.name: row for row in _from_blocks(case, _TIERS).rows}
        for name, (ratio, q1, q3) in figures.items():
            row = rows[name]
            assert (row.ratio, row.ratio_q1, row.ratio_q3) == pytest.approx(
                (ratio, q1, q3)
            )


def test_noise_never_makes_the_slower_setting_firm_advice():
    # ResNet-50: pool-size-free was faster in 3 of 4 blocks, slower in the
    # loaded one: the blocks cannot tell (a coin gives 3 of 4 once in 3), so
    # the advice says so and asks for more blocks, instead of enable().
    report = _from_blocks(_RESNET50, _TIERS)
    advice = report.advice()
    assert (advice.verdict, advice.faster_blocks, advice.blocks) == (
        "inconclusive",
        3,
        4,
    )
    assert _advice.undecided(advice)  # `tfdet cost` runs more blocks.
    assert report.recommended() is None
    assert report.recommendation() == (
        "For any x86 CPU: inconclusive: tfdet.pool-size-free (0.96x plain "
        "TensorFlow) and tfdet.enable() (2.18x) could not be told apart (the first "
        "faster in 3 of 4 blocks): rerun with --blocks 8 on a quieter machine."
    )
    # The blocks run while it is inconclusive decide it.
    more = {name: ratios + ratios[:1] * 4 for name, ratios in _RESNET50.items()}
    decided = _from_blocks(more, _TIERS)
    assert decided.advice().verdict == "firm"
    assert decided.recommended().name == "pool-size-free"
    # Transformer: pool-size-free faster in every block.
    report = _from_blocks(_TRANSFORMER, _TIERS)
    assert report.recommended().name == "pool-size-free"
    assert report.recommendation() == (
        "For any x86 CPU: use tfdet.pool-size-free: 1.90x plain TensorFlow here, "
        "faster than tfdet.enable() (4.37x) in 4 of 4 blocks."
    )


def test_a_clear_win_and_a_tie():
    win = _from_blocks(
        {"enable()": [1.9, 2.0, 2.1, 2.0], "pool-size-free": [1.0, 1.1, 0.9, 1.0]},
        _TIERS,
    )
    assert win.advice().verdict == "firm"
    assert win.recommended().name == "pool-size-free"
    # Within 10%: the default stays, whatever the blocks say.
    tie = _from_blocks(
        {"enable()": [1.05, 1.06, 1.04, 1.05], "pool-size-free": [1.0, 1.0, 1.0, 1.0]},
        _TIERS,
    )
    assert tie.advice().verdict == "tie"
    assert tie.recommended().name == "enable()"
    assert tie.recommendation() == (
        "For any x86 CPU: use tfdet.enable(): 1.05x plain TensorFlow here "
        "(tfdet.pool-size-free, 1.00x, is within 10%: not worth leaving it)."
    )


def test_the_sign_test_needs_more_than_chance():
    assert not _advice.separated(3, 4) and _advice.separated(4, 4)
    assert not _advice.separated(6, 8) and _advice.separated(7, 8)
    assert not _advice.separated(0, 0)
    assert _advice.blocks_bound(4) == 8


def test_each_tier_is_advised_from_the_settings_that_give_it():
    report = _from_blocks(
        {
            "enable()": [1.9, 2.0, 2.1, 2.0],
            "enable(threads=2)": [1.1, 1.2, 1.1, 1.1],
            "enable(threads=2, cpu_isa=None)": [0.8, 0.9, 0.8, 0.8],
            "pool-size-free": [1.5, 1.6, 1.7, 1.6],
        },
        {
            **_TIERS,
            "enable(threads=2)": _THIS_MACHINE,
            "enable(threads=2, cpu_isa=None)": _THIS_MACHINE,
        },
    )
    chosen = {
        tier.name: report.advice((tier.name,)).setting for tier in _tiers.CPU_TIERS
    }
    assert chosen == {
        "this-machine": "enable(threads=2, cpu_isa=None)",
        "any-thread-count": "pool-size-free",
        "any-x86-cpu": "pool-size-free",
        "any-batch": "pool-size-free",
    }
    # The need picks the sentence; a cheaper setting that gives less is named.
    assert report.recommendation().endswith(
        "; tfdet.enable(threads=2, cpu_isa=None) is 0.80x but does not give any "
        "x86 CPU."
    )
    narrow = dataclasses.replace(report, need=("this-machine",))
    assert narrow.recommended().name == "enable(threads=2, cpu_isa=None)"
    text = str(report)
    assert "  this machine      enable(threads=2, cpu_isa=None) 0.80x" in text


def test_settings_that_did_not_run_as_asked_or_repeat_give_no_tier():
    report = _cost(
        _row("enable()", 1.9),
        _row("xla", 1.2, note="Keras turned jit_compile off"),  # Not what was asked.
        dataclasses.replace(_row("flaky", 1.0), digests=("a", "b")),
    )
    assert report.rows[3].gives == ()
    assert report.recommended().name == "enable()"
    assert _cost(_row("threads", 1.0, ("2 threads",))).advice().verdict == "none"


class _FakeWorker:
    """A setting's process as `_measure._round` sees it, with fixed times."""

    def __init__(self, name: str, ms: float, log: list[str]) -> None:
        self.setting, self.finished, self._ms, self._log = (
            Setting(name, {}),
            False,
            ms,
            log,
        )

    def ready(self) -> dict:
        return {"xla": False, "profile": {}}

    def ask(self, request: dict) -> dict:
        self._log.append(f"{self.setting.name}:{next(iter(request))}")
        if "steps" in request:
            return {"ms": [self._ms] * request["steps"]}
        return {"digest": "d"} if "digest" in request else {"ops": {}}


def test_more_blocks_run_after_the_digests_while_the_advice_asks():
    log: list[str] = []
    workers = [_FakeWorker("plain", 10.0, log), _FakeWorker("enable()", 20.0, log)]
    figures = _measure._Figures()
    asked = iter([True, True, False])
    _measure._round(workers, figures, 0, 4, 2, lambda text: None, lambda: next(asked))
    assert len(figures.per_block) == 6
    # The digests come after the blocks asked for, so that every round's
    # digests cover the same steps; the profile comes last.
    kinds = [entry.split(":")[1] for entry in log]
    assert kinds == ["steps"] * 8 + ["digest"] * 2 + ["steps"] * 4 + ["profile"] * 2


def _conclude(report, max_ratio):
    from tfdet._cli import cost

    args = argparse.Namespace(json=None, plot=None, max_ratio=max_ratio)
    return cost.conclude(report, args)


def test_max_ratio_gates_the_advised_setting(capsys):
    report = _from_blocks(_TRANSFORMER, _TIERS)  # Advised: 1.90x.
    assert _conclude(report, None) == 0
    assert _conclude(report, 2.0) == 0
    capsys.readouterr()
    assert _conclude(report, 1.5) == 1
    assert (
        "the setting advised for any x86 CPU costs 1.90x plain TensorFlow, above "
        "--max-ratio 1.5 (exit 1)" in capsys.readouterr().err
    )
    # Inconclusive: only when even the cheaper of the two is above it.
    inconclusive = _from_blocks(_RESNET50, _TIERS)  # 0.96x or 2.18x.
    assert _conclude(inconclusive, 1.25) == 0
    assert _conclude(inconclusive, 0.9) == 1
    # No setting gives the need: the gate cannot pass.
    assert _conclude(dataclasses.replace(report, need=("any-batch",)), 5.0) == 0
    assert _conclude(_cost(_row("t", 1.0, ("2 threads",))), 5.0) == 1


def test_op_growth_is_against_plain_tensorflow_and_lists_new_ops():
    plain = _row(PLAIN.name, 1.0, ops={"Conv2D": {"ms": 4.0, "node": "c"}})
    tfdet = _row(
        "enable()",
        2.0,
        ops={
            "Conv2D": {"ms": 9.0, "node": "c"},
            "PoolSizeFreeMatMul": {"ms": 2.0, "node": "m"},
        },
    )
    grown = tfdet.growth(plain)
    assert [(g.op, g.plain_ms, g.ms, g.grew_ms) for g in grown] == [
        ("Conv2D", 4.0, 9.0, 5.0),
        ("PoolSizeFreeMatMul", 0.0, 2.0, 2.0),
    ]


# --- The command, in fresh processes ------------------------------------------


def test_bad_schedules_are_usage_errors():
    result = run_tfdet("cost", "--blocks", "0")
    assert result.returncode == 2, result.stderr
    assert "Expected --rounds, --blocks and --steps >= 1" in result.stderr
    result = run_tfdet("cost", "--timeout", "0")
    assert result.returncode == 2, result.stderr
    assert "finite and > 0" in result.stderr


def _env_refusing_tensorflow(tmp_path, *paths: str) -> dict[str, str]:
    """The tests' environment with a TensorFlow that cannot be imported first
    on the path (in `tmp_path/fake`), then `paths`."""
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env["PYTHONPATH"], *paths])
    return env


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--plot", "cost.txt"], "--plot: Expected a file name whose extension is a picture format"),
        (["--plot", "no-such-dir/cost.png"], "Expected --plot to name a writable file"),
        (["--script", "missing.py"], "Expected --script to name a Python script. No such file: 'missing.py'"),
        (["--need", "any-gpu"], "Expected tiers from this-machine, any-thread-count, any-x86-cpu, any-batch"),
        (["--max-ratio", "0"], "Expected --max-ratio to be a finite number > 0"),
    ],
    ids=["plot-extension", "plot-unwritable", "missing-script", "need", "max-ratio"],
)  # fmt: skip
def test_bad_input_exits_2_before_tensorflow_starts(tmp_path, flags, message):
    # Input checked before the runs start never meets TensorFlow (before, the
    # run failed, exit 3, or the whole measurement ran before --plot's
    # error). matplotlib, where pytest has it apart
    # (conftest.PLOT_PACKAGE_PATHS): the extension is checked against the
    # formats it writes.
    env = _env_refusing_tensorflow(tmp_path, *PLOT_PACKAGE_PATHS)
    result = run_tfdet("cost", *flags, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and "TensorFlow was imported" not in (
        result.stderr
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fake"]


@pytest.mark.skipif(
    bool(_devices._device_nodes()), reason="this machine may have a GPU"
)
def test_device_gpu_without_one_exits_4_before_tensorflow_starts(tmp_path):
    env = _env_refusing_tensorflow(tmp_path)
    result = run_tfdet("cost", "--device", "gpu", env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 4, result.stderr
    assert "Expected a GPU for --device gpu." in result.stderr, result.stderr
    assert "no GPU device nodes on this machine" in result.stderr
    # The GPU's tier is not one a CPU run can be advised for.
    result = run_tfdet("cost", "--need", "same-gpu", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Expected tiers from this-machine" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_gpu_report_names_the_gpu_and_advises_for_its_tier():
    gpu = ("same-gpu",)
    follow = ("the GPU model and its software",)
    report = dataclasses.replace(
        _cost(
            _row("enable()", 1.15, follow, tiers=gpu),
            dataclasses.replace(
                _row(OP_DETERMINISM.name, 1.10, follow, tiers=gpu),
                setting=OP_DETERMINISM,
            ),
        ),
        device="gpu",
        device_name="NVIDIA H100 80GB HBM3",
        need=_cost_report.default_need("gpu"),
    )
    text = str(report)
    assert text.startswith(
        "tfdet cost builtin:cnn: GPU NVIDIA H100 80GB HBM3, host 2 cores (a CPU)"
    )
    assert "the same GPU (bits follow the GPU model and its software)" in text
    # Within 10%: the default enable() is kept, for the GPU's one tier only.
    assert "  the same GPU      enable() 1.15x" in text
    assert "any x86 CPU" not in text
    data = report.to_dict()
    assert (data["device"], data["need"]) == ("gpu", ["same-gpu"])
    assert list(data["advice_per_tier"]) == ["same-gpu"]
    assert data["recommended"] == "enable()"


@pytest.mark.slow
def test_tensorflows_own_op_determinism_is_a_setting_and_the_report_says_where_it_ran():
    # Asked for the GPU on a machine without one (the library does not
    # refuse: the CLI does), the runs train on the CPU, and the report and
    # the tiers say so from what each run reported.
    report = _measure.measure(
        "builtin:cnn",
        [PLAIN, OP_DETERMINISM],
        rounds=1,
        blocks=1,
        steps=1,
        warmup=0,
        device="gpu",
    )
    assert (report.device, report.device_name) == ("cpu", None)
    plain, op_determinism = report.rows
    assert plain.tiers == ()
    # TensorFlow's switch reached the run (its profile says so); its bits
    # follow the cores and the CPU's instructions, as tfdet's native row.
    assert op_determinism.tiers == ("this-machine",)
    assert op_determinism.bits_follow == ("the core count", "the CPU's instruction set")
    assert report.need == _cost_report.DEFAULT_NEED


def test_a_target_that_cannot_be_built_exits_2(tmp_path):
    target = tmp_path / "model.py"
    target.write_text("def build():\n    return 42\n")
    result = run_tfdet("cost", f"{target}:build", "--blocks", "1", "--steps", "1")
    assert result.returncode == 2, result.stderr
    assert "Expected TARGET" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_cost_times_every_setting_and_names_the_op_it_replaces(tmp_path):
    report_path = tmp_path / "cost.json"
    result = run_tfdet(
        "cost",
        "builtin:cnn",
        "--rounds", "2", "--blocks", "2", "--steps", "2", "--warmup", "1",
        "--no-xla", "--json", str(report_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    rows = {row["setting"]["name"]: row for row in report["rows"]}
    cores = len(os.sched_getaffinity(0))
    assert list(rows)[:2] == ["plain TensorFlow", "enable()"]
    assert not any(row["setting"]["jit_compile"] for row in rows.values())
    assert rows["plain TensorFlow"]["ratio"] == 1.0
    # From each run's own profile: plain TensorFlow's threads follow the
    # cores; enable()'s pools of every core and its AVX2 cap do not.
    assert "the core count" in rows["plain TensorFlow"]["bits_follow"]
    assert rows["enable()"]["portable"]
    for row in rows.values():
        assert row["ms_per_step"] > 0 and row["ratio_q1"] <= row["ratio_q3"]
        assert len(row["digests"]) == 2
        if row["setting"]["enable"] is not None:
            # Two fresh processes per setting trained the same steps.
            assert row["repeatable"], row
    every_cpu_tier = ["this-machine", "any-thread-count", "any-x86-cpu", "any-batch"]
    assert rows["plain TensorFlow"]["gives"] == []
    assert rows["enable()"]["gives"] == every_cpu_tier
    assert rows["enable()"]["bits_follow"] == []
    if cores > 1:
        # The default's pool of every core gives the bits of one thread.
        one_thread = rows["enable(threads=1)"]
        assert one_thread["gives"] == every_cpu_tier
        assert one_thread["digests"] == rows["enable()"]["digests"]
    native = rows["enable(cpu_isa=None)"]
    assert native["gives"] == ["this-machine", "any-thread-count", "any-batch"]
    assert native["bits_follow"] == ["the CPU's instruction set"]
    assert rows["plain TensorFlow"]["ops"] and rows["enable()"]["ops"]
    # Firm or a tie names a setting; on a noisy machine it may be inconclusive.
    assert report["need"] == ["any-x86-cpu"]
    assert report["blocks_timed"] == len(report["per_block_ms"]) >= 4
    if report["advice"]["verdict"] == "inconclusive":
        assert report["recommended"] is None
    else:
        assert "any-x86-cpu" in rows[report["recommended"]]["gives"]
    assert report["recommendation"] in result.stdout
    assert "ms/step" in result.stdout


def test_the_ratio_is_the_median_of_the_block_ratios_as_the_benchmark_gives_it():
    # A load that slows one block slows both terms of its ratio: the ratio of
    # the medians (here 15/10 = 1.5) would let that load in; the median of
    # the block ratios (2.0) does not. The benchmark reports the same figures.
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import cost_of_determinism as benchmark

    per_block = [
        {"plain": 10.0, "enable()": 20.0},
        {"plain": 30.0, "enable()": 60.0},  # A loaded block.
        {"plain": 5.0, "enable()": 15.0},
        {"plain": 8.0, "enable()": 12.0},
    ]
    figures = _measure.block_figures(per_block, "enable()", "plain")
    assert figures == _measure.BlockFigures(
        ms_per_step=17.5, ratio=2.0, ratio_q1=2.0, ratio_q3=3.0
    )
    assert _measure.block_figures(per_block, "plain", "plain").ratio == 1.0
    names = ("plain", "enable()")
    table = benchmark.table(
        per_block, {name: ["d"] for name in names}, dict.fromkeys(names, False)
    )
    assert table["enable()"]["ratio"] == figures.ratio
    assert (table["enable()"]["ratio_q1"], table["enable()"]["ratio_q3"]) == (
        figures.ratio_q1,
        figures.ratio_q3,
    )


# --- A whole script -------------------------------------------------------------

_FIT_SCRIPT = """
import sys
import numpy as np
import keras

keras.utils.set_random_seed(1)
x = np.random.rand(320, 8).astype("float32")
y = np.random.randint(0, 2, 320)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(64, activation="gelu"), keras.layers.Dense(2)]
)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
epochs = int(sys.argv[sys.argv.index("--epochs") + 1])
model.fit(
    x, y, batch_size=32, epochs=epochs, verbose=0,
    callbacks=[keras.callbacks.ModelCheckpoint("last.weights.h5", save_weights_only=True)],
)
"""

_LOOP_SCRIPT = """
import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(1)
x = np.random.rand(320, 8).astype("float32")
y = np.random.randint(0, 2, 320)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
optimizer = keras.optimizers.SGD()
for epoch in range(2):
    for start in range(0, 320, 32):
        with tf.GradientTape() as tape:
            logits = model(x[start : start + 32], training=True)
            loss = keras.losses.sparse_categorical_crossentropy(
                y[start : start + 32], logits, from_logits=True
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fit", "custom loop"])
def test_cost_times_a_whole_script_in_copies_of_its_directory(tmp_path, kind):
    (tmp_path / "train.py").write_text(_FIT_SCRIPT if kind == "fit" else _LOOP_SCRIPT)
    report_path = tmp_path.parent / f"{tmp_path.name}-cost.json"
    result = run_tfdet(
        "cost", "--script", "train.py", "--blocks", "2", "--steps", "3",
        "--json", str(report_path), "--", "--epochs", "3",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["target"] == "--script train.py --epochs 3"
    names = [row["setting"]["name"] for row in report["rows"]]
    # The script compiles its own models: XLA is not a setting here.
    assert names[:2] == ["plain TensorFlow", "enable()"]
    assert not any("jit_compile" in name for name in names)
    for row in report["rows"]:
        # One round: a digest of what the script trained, not yet compared.
        assert row["ms_per_step"] > 0 and len(row["digests"]) == 1
        assert row["repeatable"] is None
    assert report["rows"][1]["portable"]
    # Each setting ran in a copy of the directory: nothing was written here.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train.py"]


def test_a_script_that_trains_less_than_the_warm_up_exits_2(tmp_path):
    (tmp_path / "train.py").write_text("print('no training here')\n")
    result = run_tfdet("cost", "--script", "train.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Expected the script to train more than the 3 warm-up step(s)" in (
        result.stderr
    )


def test_a_target_and_a_script_together_are_a_usage_error():
    result = run_tfdet("cost", "builtin:cnn", "--script", "train.py")
    assert result.returncode == 2
    assert "Expected a TARGET or --script, not both" in result.stderr


def test_a_run_that_hangs_is_killed_at_the_timeout_and_exits_3():
    # Its first training step (a warm-up step) sleeps for ten minutes.
    target = REPO / "tests" / "targets" / "check_models.py"
    result = run_tfdet("cost", f"{target}:sleepy_model", "--timeout", "20")
    assert result.returncode == 3, result.stderr
    assert "run did not answer within 20 s (--timeout)" in result.stderr


# --- A script's runs: the runner's own pipes, directories and Keras choice -----

_TWO_SETTINGS = [PLAIN, Setting("enable()", {})]

# It reads stdin, points fd 0 and 1 at /dev/null, seeds itself from
# os.urandom and keeps a BackupAndRestore backup in an absolute directory
# of the user's: each is the script's business, none may reach tfdet's
# protocol or the user's files.
_OWN_STDIO_SCRIPT = """
import os, sys
import numpy as np
import keras

sys.stdin.read()
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
keras.utils.set_random_seed(int.from_bytes(os.urandom(4), "little"))
x = np.random.rand(64, 4).astype("float32")
y = np.random.rand(64, 1).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
backup = keras.callbacks.BackupAndRestore({backup!r}, save_freq=1)
model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[backup])
print("trained")
"""


@pytest.mark.slow
def test_a_script_keeps_its_stdio_and_the_users_backup_and_rounds_say_no(
    tmp_path, monkeypatch
):
    backup = tmp_path / "users-backup"
    backup.mkdir()
    (backup / "generation.txt").write_text("the user's own backup\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(_OWN_STDIO_SCRIPT.format(backup=str(backup)))
    monkeypatch.chdir(project)
    said = []
    report = _measure.measure(
        _measure.Workload(script="train.py"),
        _TWO_SETTINGS,
        rounds=2, blocks=1, steps=2, warmup=1, timeout=120, progress=said.append,
    )  # fmt: skip
    # Measured: the protocol never went through the script's stdin or stdout.
    assert [row.setting.name for row in report.rows] == ["plain TensorFlow", "enable()"]
    for row in report.rows:
        assert row.ms_per_step > 0
        # Seeded from os.urandom: two fresh processes differ, and it says so.
        assert row.repeatable is False and len(row.digests) == 2, row
        assert "NO (2)" in str(report)
    # Every run trained against its own copy of the backup directory.
    assert sorted(p.name for p in backup.iterdir()) == ["generation.txt"]
    assert (backup / "generation.txt").read_text() == "the user's own backup\n"
    assert any(line.startswith(f"{backup}: outside") for line in said), said


# A tf_keras script that makes the choice itself (the tf_keras guide's way)
# and trains 24 steps: 8 batches in each of 3 epochs.
_TF_KERAS_SCRIPT = """
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(1)
x = np.random.rand(64, 4).astype("float32")
y = np.random.rand(64, 1).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
assert type(model).__module__.startswith("tf_keras"), type(model)
model.compile("sgd", "mse")
model.fit(x, y, batch_size=8, epochs=3, verbose=0)
"""


@pytest.mark.slow
@pytest.mark.tf_keras
def test_a_tf_keras_script_that_chooses_it_itself_is_measured_step_by_step(
    tmp_path, monkeypatch
):
    (tmp_path / "train.py").write_text(_TF_KERAS_SCRIPT)
    monkeypatch.chdir(tmp_path)
    # The caller's own choice is not what decides: the script's is.
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    said = []
    # 4 warm-up steps and 2 blocks of 10: exactly the script's 24 steps, so
    # a step tfdet missed would cut the second block short.
    report = _measure.measure(
        _measure.Workload(script="train.py"),
        _TWO_SETTINGS,
        blocks=2, steps=10, warmup=4, timeout=120, progress=said.append,
    )  # fmt: skip
    assert all(row.ms_per_step > 0 for row in report.rows)
    assert not [line for line in said if "ended during block" in line], said
    assert sum("block 2/2" in line for line in said) == 1, said


def test_rounds_say_why_they_cannot_tell_whether_the_bits_repeat():
    same = {"digest": "d1", "steps": 9}
    assert _measure._repeat([same, same]) == (("d1", "d1"), None)
    assert _measure._repeat([same, {"digest": "d2", "steps": 9}])[1] is None
    digests, why = _measure._repeat([same, {"digest": "d2", "steps": 7}])
    assert digests == () and "different step counts before the digest (7, 9)" in why
    digests, why = _measure._repeat([same, {"digest": None, "why": "no model"}])
    assert (digests, why) == ((), "no model")
    row = dataclasses.replace(
        _row("enable()", 1.0), digests=(), same_bits_unknown="no model"
    )
    text = str(_cost(row))
    assert "unknown" in text and "enable(): same bits unknown: no model" in text
