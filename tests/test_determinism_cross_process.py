"""Bit equality of training across fresh processes, with and without tfdet.

Each run is a fresh interpreter that trains the built-in CNN (convolutions,
max-pooling, Dropout, Dense, RMSprop) for 3 `train_on_batch` steps and prints
the SHA-256 of every weight. With `tfdet.enable()` (whose pools follow the
cores, and whose kernels make their size decide no bit) the weights must be
bit-identical under perturbations that imitate another machine (fewer cores,
a different oneDNN ISA, another hash seed). Without it (seeds only), the same
perturbations must change the bits: that is what shows these tests can fail.
Where a perturbation does not change the bits on this machine, the unpinned
half is skipped with the reason, never passed.

On CPUs above AVX2 the default AVX2 cap alone can make 1 and 2 cores agree
(measured on a 2-core Xeon with AVX-512: under the cap, TensorFlow's default
thread pools on 1 and 2 cores give the same CNN bits), so thread pinning is
also checked with oneDNN uncapped, with TensorFlow's own products (whose
bits follow the pool) at a pinned pool of one.

Every run is started when the module's first test asks, two at a time (these
machines have 2 cores; bits do not depend on load), and shared by the tests
that compare it. Selecting one test still starts them all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import (
    REPO,
    TENSORFLOW_PRODUCTS,
    clean_env,
    last_json_line,
    run_python,
)
from tfdet._pin import _cpus, _isa
from tfdet._pin._profile import Profile

STEPS = 3
HASH_SEED = "12345"
EXAMPLE = REPO / "examples" / "train_reproducibly.py"

# Trains TARGET for STEPS steps in a fresh process; mode "enable" calls
# tfdet.enable(**kwargs) first, "seeds" only keras.utils.set_random_seed(0).
_TRAIN = """
import hashlib, json, os, sys
mode, target, steps, kwargs = {mode!r}, {target!r}, {steps!r}, {kwargs!r}
if mode == "enable":
    import tfdet
    profile = tfdet.enable(**kwargs).to_dict()
else:
    import keras
    keras.utils.set_random_seed(0)
    profile = None
import tensorflow as tf
from tfdet._record import _bits
from tfdet._target import _load
built = _load.build(target)
losses = []
for step in range(steps):
    x, y = built.batch(step)
    out = built.model.train_on_batch(x, y)
    losses.append(_bits.value_bits(out[0] if isinstance(out, list) else out)["bits"])
digests = _bits.weights_digests(built.model.weights, built.model.get_weights())
print(json.dumps({{
    "digest": hashlib.sha256("".join(digests.values()).encode()).hexdigest(),
    "weights": digests,
    "losses": losses,
    "profile": profile,
    "affinity": sorted(os.sched_getaffinity(0)),
    "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
    "isa_cap": os.environ.get("ONEDNN_MAX_CPU_ISA"),
    "hash_randomization": sys.flags.hash_randomization,
}}))
"""


@dataclasses.dataclass(frozen=True)
class Config:
    """One fresh training run: what it trains and how it is perturbed."""

    mode: str  # "enable", "seeds" or "example" (runs examples/train_reproducibly.py)
    target: str = "builtin:cnn"
    one_cpu: bool = False  # Affinity to 1 CPU instead of 2.
    isa_cap: str | None = None  # ONEDNN_MAX_CPU_ISA set before start.
    hash_seed: str | None = None  # PYTHONHASHSEED at start (None: random).
    repeat: int = 0  # Distinguishes an identical run used as a control.
    threads: int | None = None  # enable(threads=...); None: the default.
    uncapped: bool = False  # enable(cpu_isa=None): oneDNN keeps its best ISA.
    # TensorFlow's own products and convolutions instead of tfdet's.
    tensorflow_products: bool = False

    @property
    def enable_kwargs(self) -> dict:
        kwargs: dict = {"threads": self.threads} if self.threads is not None else {}
        if self.uncapped:
            kwargs["cpu_isa"] = None
        if self.tensorflow_products:
            kwargs["patches"] = TENSORFLOW_PRODUCTS.split(",")
        return kwargs

    @property
    def legacy_keras(self) -> bool:
        return self.target.endswith("_tf_keras")


# A pool pinned at one thread, oneDNN uncapped, TensorFlow's own products:
# what pinning the pools alone does.
PINNED_ONE = Config("enable", threads=1, uncapped=True, tensorflow_products=True)


def _configs(has_two_cpus: bool, has_tf_keras: bool) -> list[Config]:
    configs = []
    targets = [("builtin:cnn", ("enable", "seeds"))]
    if has_tf_keras:
        targets.append(("builtin:cnn_tf_keras", ("enable", "seeds")))
    for target, modes in targets:
        for mode in modes:
            configs.append(Config(mode, target))
            if has_two_cpus:
                configs.append(Config(mode, target, one_cpu=True))
            configs.append(Config(mode, target, isa_cap="AVX2"))
        configs.append(Config("enable", target, hash_seed=HASH_SEED))
    # Control: seeds alone, same settings, another process. Shows that the
    # differences found without tfdet come from the perturbations.
    configs.append(Config("seeds", repeat=1))
    # Thread pinning on its own, with oneDNN uncapped: on CPUs above AVX2 the
    # AVX2 cap alone can already make 1 and 2 cores agree, hiding whether
    # pinning the pools works.
    if has_two_cpus:
        configs.append(PINNED_ONE)
        configs.append(dataclasses.replace(PINNED_ONE, one_cpu=True))
    configs.append(dataclasses.replace(PINNED_ONE, threads=2))
    # The copyable example, as a user runs it.
    if has_two_cpus:
        configs.append(Config("example"))
        configs.append(Config("example", one_cpu=True))
    return configs


def _example_result(stdout: str) -> list[str]:
    """The example's final-loss and weights lines (the bits it promises)."""
    lines = [
        line
        for line in stdout.splitlines()
        if line.startswith(("final loss:", "weights sha256:"))
    ]
    assert len(lines) == 2, f"unexpected example output:\n{stdout}"
    return lines


class Runs:
    """Starts every configured run at once (2 at a time), waits on demand."""

    def __init__(self, configs: list[Config], cpus: list[int]) -> None:
        self._cpus = cpus
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self._futures = {
            config: self._pool.submit(self._run, config) for config in configs
        }

    def _run(self, config: Config) -> dict:
        env = clean_env(
            ONEDNN_MAX_CPU_ISA=config.isa_cap,
            PYTHONHASHSEED=config.hash_seed,
            TF_USE_LEGACY_KERAS="1" if config.legacy_keras else None,
        )
        if config.mode == "example":
            code = (
                f"import runpy; runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')"
            )
        else:
            code = _TRAIN.format(
                mode=config.mode,
                target=config.target,
                steps=STEPS,
                kwargs=config.enable_kwargs,
            )
        cpus = self._cpus[:1] if config.one_cpu else self._cpus[:2]
        result = run_python(code, env=env, cpus=cpus or None, timeout=240)
        if result.returncode != 0:
            raise AssertionError(
                f"run {config} failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
            )
        if config.mode == "example":
            return {"output": _example_result(result.stdout)}
        return last_json_line(result.stdout)

    def get(self, config: Config) -> dict:
        if config not in self._futures:
            pytest.skip(f"{config} is not run on this machine")
        return self._futures[config].result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = []
    has_tf_keras = importlib.util.find_spec("tf_keras") is not None
    runs = Runs(_configs(len(cpus) >= 2, has_tf_keras), cpus)
    yield runs
    runs.close()


def _differing(a: dict, b: dict) -> list[str]:
    return [
        name for name in a["weights"] if a["weights"][name] != b["weights"].get(name)
    ]


def _assert_identical(base: dict, other: dict, what: str) -> None:
    assert base["losses"] == other["losses"], f"{what}: loss bits differ"
    assert base["digest"] == other["digest"], (
        f"{what}: weights differ in {_differing(base, other)}"
    )


def _assert_differs_or_skip(base: dict, other: dict, what: str) -> None:
    if base["digest"] == other["digest"]:
        pytest.skip(
            f"without tfdet.enable(), {what} did not change the weight bits on "
            "this machine, so the pinned test above proves nothing for it here"
        )


def _require_two_cpus() -> None:
    try:
        if len(os.sched_getaffinity(0)) < 2:
            pytest.skip("the affinity perturbation needs at least 2 CPUs")
    except AttributeError:
        pytest.skip("CPU affinity is not available on this platform")


def _require_isa_above_avx2() -> None:
    if not _isa.applies():
        pytest.skip("oneDNN ISA caps apply to x86-64 only")
    if _isa.rank(_isa.best_supported()) <= _isa.rank("AVX2"):
        pytest.skip("this CPU's best ISA is AVX2: an AVX2 cap changes nothing")


def _require_tf_keras() -> None:
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed")


KERAS_TARGETS = [
    pytest.param("builtin:cnn", id="keras3"),
    pytest.param("builtin:cnn_tf_keras", id="tf_keras"),
]


@pytest.mark.slow
@pytest.mark.parametrize("target", KERAS_TARGETS)
def test_enabled_weights_identical_on_one_and_two_cores(
    runs: Runs, target: str
) -> None:
    if "tf_keras" in target:
        _require_tf_keras()
    _require_two_cpus()
    two = runs.get(Config("enable", target))
    one = runs.get(Config("enable", target, one_cpu=True))
    assert (len(one["affinity"]), len(two["affinity"])) == (1, 2)
    # The default's pools follow the cores; its bits do not.
    assert (one["intra_op_threads"], two["intra_op_threads"]) == (1, 2)
    _assert_identical(two, one, "1 core vs 2 cores")


@pytest.mark.slow
@pytest.mark.parametrize("target", KERAS_TARGETS)
def test_seeded_only_weights_differ_on_one_and_two_cores(
    runs: Runs, target: str
) -> None:
    if "tf_keras" in target:
        _require_tf_keras()
    _require_two_cpus()
    two = runs.get(Config("seeds", target))
    one = runs.get(Config("seeds", target, one_cpu=True))
    assert (len(one["affinity"]), len(two["affinity"])) == (1, 2)
    _assert_differs_or_skip(two, one, "confining the process to 1 core instead of 2")


@pytest.mark.slow
@pytest.mark.parametrize("target", KERAS_TARGETS)
def test_enabled_weights_identical_with_preset_avx2_cap_and_none(
    runs: Runs, target: str
) -> None:
    if "tf_keras" in target:
        _require_tf_keras()
    _require_isa_above_avx2()
    uncapped = runs.get(Config("enable", target))
    capped = runs.get(Config("enable", target, isa_cap="AVX2"))
    # Both end at enable()'s default cap, whatever the process started with.
    assert uncapped["isa_cap"] == capped["isa_cap"] == "AVX2"
    _assert_identical(uncapped, capped, "ONEDNN_MAX_CPU_ISA=AVX2 preset vs unset")


@pytest.mark.slow
@pytest.mark.parametrize("target", KERAS_TARGETS)
def test_seeded_only_weights_differ_with_avx2_cap_and_none(
    runs: Runs, target: str
) -> None:
    if "tf_keras" in target:
        _require_tf_keras()
    _require_isa_above_avx2()
    uncapped = runs.get(Config("seeds", target))
    capped = runs.get(Config("seeds", target, isa_cap="AVX2"))
    assert (uncapped["isa_cap"], capped["isa_cap"]) == (None, "AVX2")
    _assert_differs_or_skip(uncapped, capped, "capping oneDNN at AVX2")


@pytest.mark.slow
@pytest.mark.parametrize("target", KERAS_TARGETS)
def test_enabled_weights_identical_with_different_hash_seeds(
    runs: Runs, target: str
) -> None:
    if "tf_keras" in target:
        _require_tf_keras()
    randomized = runs.get(Config("enable", target))
    fixed = runs.get(Config("enable", target, hash_seed=HASH_SEED))
    assert (randomized["hash_randomization"], fixed["hash_randomization"]) == (1, 1)
    assert randomized["profile"]["python_hash_seed"] is None
    assert fixed["profile"]["python_hash_seed"] == HASH_SEED
    _assert_identical(randomized, fixed, f"PYTHONHASHSEED random vs {HASH_SEED}")


@pytest.mark.slow
def test_enabled_runs_record_the_same_profile_under_every_perturbation(
    runs: Runs,
) -> None:
    base = runs.get(Config("enable"))["profile"]
    others = [Config("enable", isa_cap="AVX2")]
    if len(os.sched_getaffinity(0)) >= 2:
        others.append(Config("enable", one_cpu=True))
    for config in others:
        # Equal in every field that decides bits (the pool sizes follow the
        # cores, and under the default decide none).
        other = Profile.from_dict(runs.get(config)["profile"])
        assert Profile.from_dict(base).differences(other) == {}, config
    cpus = _cpus.usable_cpus()
    assert base["intra_op_threads"] == base["inter_op_threads"] == cpus
    assert base["op_determinism"] is True
    assert json.loads(json.dumps(base)) == base


@pytest.mark.slow
def test_seeded_only_weights_identical_without_perturbation(runs: Runs) -> None:
    first = runs.get(Config("seeds"))
    second = runs.get(Config("seeds", repeat=1))
    _assert_identical(first, second, "seeds only, same settings")


@pytest.mark.slow
def test_pinned_threads_alone_make_one_and_two_cores_agree(runs: Runs) -> None:
    _require_two_cpus()
    two = runs.get(PINNED_ONE)
    one = runs.get(dataclasses.replace(PINNED_ONE, one_cpu=True))
    assert two["isa_cap"] is None and one["isa_cap"] is None
    _assert_identical(two, one, "threads=1, cpu_isa=None, 1 core vs 2 cores")


@pytest.mark.slow
def test_thread_pool_size_decides_the_bits(runs: Runs) -> None:
    # Why `threads` is part of the profile: with TensorFlow's own products a
    # different pool size is a different experiment, even on one machine.
    one_thread = runs.get(PINNED_ONE)
    two_threads = runs.get(dataclasses.replace(PINNED_ONE, threads=2))
    assert two_threads["intra_op_threads"] == 2
    if one_thread["digest"] == two_threads["digest"]:
        pytest.skip("threads=1 and threads=2 gave the same bits on this machine")


@pytest.mark.slow
def test_example_prints_the_same_bits_on_one_and_two_cores(runs: Runs) -> None:
    _require_two_cpus()
    two = runs.get(Config("example"))["output"]
    one = runs.get(Config("example", one_cpu=True))["output"]
    assert one == two
