"""The patch registry, and each patch against the op it replaces, on CPU.

The registry (`tfdet._patching._registry`): every declared patch is found, is
named like its module, replaces ops the hazard table marks hazardous, installs
and restores exactly and idempotently; `needed()`, `resolve()`, `install()`,
deferral until a module's import, and discovery are tested directly on probe
patches. The registry tests iterate over the registered patches: a new patch
module is checked by them without touching this file's lists (it has none).

For every patch: forward output (and gradient where the original has one)
equal to the original op's over a property-based sweep of shapes, dtypes and
edge cases (empty inputs, duplicate indices, out-of-range values raise the same
error class); the patched graph no longer contains the hazard op. Equality is
exact for integer results, and exact for floats where the replacement
accumulates in the CPU kernel's order; where it cannot, the tolerance and its
reason are stated at the assertion.

Patches change process-wide TensorFlow state; every test restores what it
installed (the `patched` context manager), so the tests share one process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from tensorflow.python.ops import gen_image_ops, gen_math_ops, gen_sparse_ops  # noqa: E402

from tests.conftest import (  # noqa: E402
    ERFC_FOLLOWS_THE_CPU_FROM,
    TENSORFLOW_RELEASE,
    clean_env,
    run_python,
)
from tfdet._graph import _scan  # noqa: E402
from tfdet._patching import _hazards, _import_hook, _registry  # noqa: E402
from tfdet._pin import _versions  # noqa: E402

# No example database: the sweep is seeded per run and leaves no files behind.
SWEEP = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
EPS32 = float(np.finfo(np.float32).eps)
PATCHES = _registry.available()
TF_KERAS = importlib.util.find_spec("tf_keras") is not None
# The patches that TensorFlow needs from a later release than 2.16, with that
# release: its Erfc kernel took the approximate reciprocal from 2.20 (before,
# its bits were measured the same natively and on an emulated CPU).
FIRST_TENSORFLOW = {
    "portable_erfc": ERFC_FOLLOWS_THE_CPU_FROM,
    # It stands in for portable_erfc's composition: nothing to do before.
    "portable_kernels": ERFC_FOLLOWS_THE_CPU_FROM,
}


@contextlib.contextmanager
def patched(*patches: _registry.Patch) -> Iterator[None]:
    for patch in patches:
        patch.install()
    try:
        yield
    finally:
        for patch in reversed(patches):
            patch.restore()


def op_types(function, *args) -> set[str]:
    """Op types of `function` traced on `args`, nested functions included."""
    concrete = tf.function(function).get_concrete_function(*args)
    return {node.op_type for node in _scan.walk(concrete.graph.as_graph_def())}


def assert_same_error(original, replacement) -> None:
    """Both raise, and the replacement's error is the original's class."""
    with pytest.raises(Exception) as expected:
        original()
    with pytest.raises(type(expected.value)):
        replacement()


# ---------------------------------------------------------------- registry


def test_every_public_patch_module_is_registered() -> None:
    # Discovery finds the modules on disk; nothing lists them.
    import pkgutil

    import tfdet.patches

    modules = {
        info.name
        for info in pkgutil.iter_modules(tfdet.patches.__path__)
        if not info.name.startswith("_")
    }
    assert modules and set(PATCHES) == modules


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_declaration_names_hazardous_ops_no_other_patch_claims(name: str) -> None:
    patch = PATCHES[name]
    assert sys.modules[f"tfdet.patches.{name}"].PATCH is patch
    assert patch.summary and patch.upstream.startswith("https://")
    # A patch that replaces no op of the hazard table fixes Keras code (it
    # must say for which Keras), decides tf.distribute settings (it must say
    # which), pins a process setting of TensorFlow's libraries (it must say
    # where it cannot), computes ops apart from the pool size (it must name
    # them: `COVERED`, some of which the hazard table knows, left out of
    # `replaces` so that `tfdet scan` names the patch only for hazards), or
    # is opt-in (it buys a promise beyond the profile's, and "auto" never
    # installs it).
    covered = getattr(sys.modules[f"tfdet.patches.{name}"], "COVERED", ())
    assert not covered or any(_hazards.table().rows_for(op) for op in covered)
    assert (
        patch.replaces
        or patch.requires
        or patch.distribution
        or patch.unavailable
        or covered
        or patch.opt_in
    )
    for op_type in patch.replaces:
        # A typo in an op name, or an op the table does not call a hazard,
        # would make the patch cover nothing in `tfdet scan`. An opt-in patch
        # may replace ops measured fine (cuDNN's RNN): the table must still
        # know them.
        assert _hazards.table().rows_for(op_type), op_type
        if not patch.opt_in:
            first = FIRST_TENSORFLOW.get(name, (2, 16))
            assert _hazards.needs_patch((op_type,), "{}.{}.0".format(*first)), op_type
        assert _registry.covering(op_type) == name, op_type


# Patches whose ops stand in for another patch's composition.
STANDS_ON = {"portable_kernels": "portable_erfc"}


def _current(owner, attribute: str):
    return owner[attribute] if isinstance(owner, dict) else getattr(owner, attribute)


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_install_twice_then_restore_puts_every_original_back(name: str) -> None:
    patch = PATCHES[name]
    for module, _ in patch.after_import:
        # Imported first, so the deferred part is applied (and checked) now.
        pytest.importorskip(module)
    assert not patch.installed
    # A patch that stands in for another's composition replaces nothing alone.
    beneath = STANDS_ON.get(name)
    if beneath is not None:
        if not PATCHES[beneath].needed():
            pytest.skip(f"{name} has nothing to stand for without {beneath} here")
        PATCHES[beneath].install()
    patch.install()
    try:
        saved = patch.replaced()
        assert saved, "install() replaced nothing"
        for owner, attribute, original in saved:
            assert _current(owner, attribute) is not original, attribute
        patch.install()  # Must not record the replacement as an original.
        assert patch.replaced() == saved
        assert _registry.installed() == tuple(sorted(filter(None, (name, beneath))))
    finally:
        patch.restore()
        patch.restore()
        if beneath is not None:
            PATCHES[beneath].restore()
    for owner, attribute, original in saved:
        assert _current(owner, attribute) is original, attribute
    assert not patch.installed and patch.replaced() == ()
    assert _registry.installed() == ()


class _Box:
    value = "original"


def _probe(name: str, replaces=("ResizeNearestNeighborGrad",), **fields):
    fields.setdefault("apply", lambda swap: swap.attribute(_Box, "value", name))
    return _registry.Patch(
        name=name, replaces=replaces, summary="probe", upstream="https://x", **fields
    )


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch):
    """A registry of two probe patches in place of tfdet's."""
    registry = {
        "a_probe": _probe("a_probe"),
        "b_probe": _probe("b_probe", ("Conv2D",)),
        "c_probe": _probe("c_probe", opt_in=True),
    }
    monkeypatch.setattr(_registry, "_REGISTRY", dict(registry))
    yield registry
    for patch in registry.values():
        patch.restore()


def test_registry_installs_restores_and_covers(probes) -> None:
    assert _registry.covering("ResizeNearestNeighborGrad") == "a_probe"
    assert _registry.covering("Conv2D") == "b_probe"
    assert _registry.covering("MatMul") is None
    assert _registry.install(["a_probe"]) == ("a_probe",)
    assert _Box.value == "a_probe"
    assert _registry.install(["a_probe"]) == ("a_probe",)
    assert probes["a_probe"].replaced() == ((_Box, "value", "original"),)
    _registry.restore()
    assert _Box.value == "original" and _registry.installed() == ()


def test_resolve(probes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    # b_probe replaces Conv2D, which the table does not call a hazard.
    assert _registry.resolve("auto") == _registry.resolve(True) == ["a_probe"]
    assert _registry.resolve(None) == _registry.resolve(False) == []
    assert _registry.resolve(["b_probe", "a_probe", "b_probe"]) == [
        "a_probe",
        "b_probe",
    ]
    # An opt-in patch is needed by these versions, yet only installed when
    # named; "auto" in a list adds the patches "auto" selects.
    assert probes["c_probe"].needed()
    assert _registry.resolve(["c_probe", "auto"]) == ["a_probe", "c_probe"]
    with pytest.raises(ValueError, match=r"Received unknown: \['nope'\]"):
        _registry.resolve(["a_probe", "nope"])
    with pytest.raises(ValueError, match="Received: patches='a_probe'"):
        _registry.resolve("a_probe")


def test_needed_follows_the_table_for_the_installed_tensorflow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patch = _probe("probe")
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    assert patch.needed()
    assert not _probe("probe", ("Conv2D",)).needed()
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.15.0")
    )
    assert not patch.needed()
    monkeypatch.setattr(_versions, "tensorflow_distribution", lambda: None)
    assert not patch.needed()


def test_tf_keras_requirement_needs_tf_keras_installed_not_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whether tf_keras is imported yet, or TF_USE_LEGACY_KERAS set, must not
    # matter: the profile would then depend on import order.
    patch = _probe("probe", requires={"tf_keras": ">=2.16", "keras_in_use": "tf_keras"})
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    monkeypatch.setattr(
        _versions, "distribution_version", lambda name: {"tf_keras": "2.21.0"}.get(name)
    )
    monkeypatch.setattr(_registry, "_tf_keras_importable", lambda: True)
    monkeypatch.delitem(sys.modules, "tf_keras", raising=False)
    for legacy in ("0", "1"):
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
        assert patch.needed()
    monkeypatch.setitem(sys.modules, "tf_keras", types.ModuleType("tf_keras"))
    assert patch.needed()
    monkeypatch.setattr(_registry, "_tf_keras_importable", lambda: False)
    assert not patch.needed()
    monkeypatch.setattr(_registry, "_tf_keras_importable", lambda: True)
    monkeypatch.setattr(
        _versions, "distribution_version", lambda name: {"tf_keras": "2.15.0"}.get(name)
    )
    assert not patch.needed()
    monkeypatch.setattr(_versions, "distribution_version", lambda name: None)
    assert not patch.needed()


def test_keras3_requirement_follows_legacy_keras(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    patch = _probe("probe", requires={"keras_in_use": "keras3"})
    monkeypatch.setattr(
        _versions, "tensorflow_distribution", lambda: ("tensorflow", "2.21.0")
    )
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    assert patch.needed()
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert not patch.needed()


def test_after_import_waits_for_the_module_and_restore_cancels(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tfdet_patch_probe.py").write_text("VALUE = 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tfdet_patch_probe", raising=False)

    def apply(swap) -> None:
        swap.attribute(sys.modules["tfdet_patch_probe"], "VALUE", "patched")

    patch = _probe(
        "probe",
        apply=None,
        after_import=(("tfdet_patch_probe", apply), ("tfdet_not_installed_xyz", apply)),
    )
    try:
        patch.install()
        # Only the installed module is waited for; nothing applied yet.
        assert patch.pending() and patch.installed and patch.replaced() == ()
        patch.restore()
        assert not patch.pending()
        module = importlib.import_module("tfdet_patch_probe")
        assert module.VALUE == "original"  # The cancelled wait never fires.
        patch.install()  # Imported now: applied at once.
        assert module.VALUE == "patched" and not patch.pending()
        patch.restore()
        assert module.VALUE == "original"
        sys.modules.pop("tfdet_patch_probe")
        patch.install()
        module = importlib.import_module("tfdet_patch_probe")
        assert module.VALUE == "patched" and not patch.pending()
    finally:
        patch.restore()
        sys.modules.pop("tfdet_patch_probe", None)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("PATCH = None\n", "declare `PATCH = Patch(name='broken'"),
        (
            "from tfdet._patching._registry import Patch\n"
            "PATCH = Patch(name='other', replaces=(), summary='', upstream='')\n",
            "Received: PATCH=Patch(name='other'",
        ),
    ],
    ids=["no PATCH", "misnamed"],
)
def test_discovery_rejects_a_module_without_its_patch(
    tmp_path, monkeypatch: pytest.MonkeyPatch, source: str, message: str
) -> None:
    package = tmp_path / "tfdet_probe_patches"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_helper.py").write_text("raise AssertionError('helpers are skipped')\n")
    (package / "good.py").write_text(
        "from tfdet._patching._registry import Patch\n"
        "PATCH = Patch(name='good', replaces=(), summary='', upstream='')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_registry, "PACKAGE", "tfdet_probe_patches")
    monkeypatch.setattr(_registry, "_REGISTRY", {})
    try:
        assert list(_registry.available()) == ["good"]
        monkeypatch.setattr(_registry, "_REGISTRY", {})
        (package / "broken.py").write_text(source)
        with pytest.raises(TypeError, match=message.replace("(", r"\(")):
            _registry.available()
    finally:
        for module in [m for m in sys.modules if m.startswith("tfdet_probe_patches")]:
            del sys.modules[module]


def test_import_hook_fires_once_after_the_import_and_not_on_find_spec(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "tfdet_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def callback() -> None:
        seen.append(sys.modules["tfdet_hook_probe"].VALUE)

    hook = _import_hook.when_imported("tfdet_hook_probe", callback)
    try:
        assert hook in sys.meta_path and seen == []
        assert importlib.util.find_spec("tfdet_hook_probe") is not None
        assert seen == []  # Looking the module up is not importing it.
        module = importlib.import_module("tfdet_hook_probe")
        assert seen == [1]  # Ran after the module's code.
        assert hook not in sys.meta_path
        assert type(module.__loader__).__name__ == "SourceFileLoader"
        importlib.reload(module)
        assert seen == [1]
        # Already imported: the callback runs at once, nothing is left pending.
        assert _import_hook.when_imported("tfdet_hook_probe", callback) is None
        assert seen == [1, 1]
    finally:
        hook.remove()
        sys.modules.pop("tfdet_hook_probe", None)


def test_removed_import_hook_never_fires(tmp_path, monkeypatch) -> None:
    (tmp_path / "tfdet_hook_probe2.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = _import_hook.when_imported("tfdet_hook_probe2", lambda: seen.append(1))
    hook.remove()
    hook.remove()
    try:
        importlib.import_module("tfdet_hook_probe2")
        assert seen == [] and hook not in sys.meta_path
    finally:
        sys.modules.pop("tfdet_hook_probe2", None)


def test_sparse_optimizer_patch_waits_for_tf_keras_and_restore_cancels() -> None:
    pytest.importorskip("tf_keras")
    result = run_python(
        """
        import json, sys
        from tfdet.patches.sparse_optimizer_update import PATCH as patch

        def wrapped():
            from tf_keras.src.optimizers.legacy import optimizer_v2
            method = vars(optimizer_v2.OptimizerV2)["apply_gradients"]
            return getattr(method, "__tfdet_patch__", None) is not None

        out = {}
        patch.install()
        patch.install()
        out["pending"] = patch.pending()
        out["imported"] = "tf_keras" in sys.modules
        patch.restore()
        out["pending_after_restore"] = patch.pending()
        import tf_keras
        out["wrapped_after_cancel"] = wrapped()
        patch.install()
        out["wrapped_now"] = wrapped() and not patch.pending()
        patch.restore()
        out["wrapped_after_restore"] = wrapped()
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "pending": True,
        "imported": False,
        "pending_after_restore": False,
        "wrapped_after_cancel": False,
        "wrapped_now": True,
        "wrapped_after_restore": False,
    }


# "auto" on these versions (TF >= 2.16): every patch from the release that
# first needs it (FIRST_TENSORFLOW), the tf_keras ones whenever tf_keras is
# installed, whichever Keras the script uses and whether it imported tf_keras
# yet (they wait for the import): the profile must not depend on import
# order. The Keras 3 fixes only where tf.keras is Keras 3.
def _auto_patches(keras_in_use: str) -> list[str]:
    # Opt-in patches are installed only when named.
    return [
        name
        for name, patch in PATCHES.items()
        if not patch.opt_in
        and FIRST_TENSORFLOW.get(name, (2, 16)) <= TENSORFLOW_RELEASE
        and (
            patch.requires.get("keras_in_use") in (None, keras_in_use)
            or (TF_KERAS and patch.requires.get("keras_in_use") == "tf_keras")
        )
    ]


@pytest.mark.parametrize(
    ("legacy", "selection", "expected"),
    [
        ("0", "'auto'", _auto_patches("keras3")),
        pytest.param(
            "1", "'auto'", _auto_patches("tf_keras"), marks=pytest.mark.tf_keras
        ),
        ("0", "['bincount']", ["bincount"]),
        ("0", "None", []),
    ],
    ids=["keras3 auto", "tf_keras auto", "selected", "none"],
)
def test_enable_installs_what_the_versions_need(
    legacy: str, selection: str, expected
) -> None:
    result = run_python(
        f"""
        import json, tfdet
        from tensorflow.python.ops import gen_math_ops
        from tfdet.patches import bincount
        profile = tfdet.enable(patches={selection})
        replaced = gen_math_ops.dense_bincount is bincount.dense_bincount
        print(json.dumps([list(profile.patches), replaced]))
        """,
        # TensorFlow is imported before enable() (to hold the original op),
        # so oneDNN is set as enable() would pin it.
        env=clean_env(
            TF_USE_LEGACY_KERAS=legacy,
            PYTHONHASHSEED="0",
            TF_ENABLE_ONEDNN_OPTS="1",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    patches, replaced = json.loads(result.stdout.strip().splitlines()[-1])
    assert patches == expected
    assert replaced == ("bincount" in expected)


# ------------------------------------------------------- nearest resize grad

from tfdet.patches import resize_nearest_grad  # noqa: E402

RESIZE_DTYPES = [np.float32, np.float64, np.float16, np.int32]


@st.composite
def resize_cases(draw):
    batch = draw(st.integers(0, 2))
    in_h, in_w = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    out_h, out_w = draw(st.integers(1, 15)), draw(st.integers(1, 15))
    channels = draw(st.integers(0, 3))
    align_corners = draw(st.booleans())
    # TF rejects half_pixel_centers together with align_corners.
    half_pixel = draw(st.booleans()) and not align_corners
    dtype = draw(st.sampled_from(RESIZE_DTYPES))
    seed = draw(st.integers(0, 2**31))
    grads = (
        np.random.default_rng(seed).standard_normal((batch, out_h, out_w, channels)) * 8
    ).astype(dtype)
    return grads, (in_h, in_w), align_corners, half_pixel


@SWEEP
@given(resize_cases())
def test_resize_nearest_grad_equals_the_kernel(case) -> None:
    grads, size, align_corners, half_pixel = case
    expected = tf.raw_ops.ResizeNearestNeighborGrad(
        grads=grads,
        size=size,
        align_corners=align_corners,
        half_pixel_centers=half_pixel,
    ).numpy()
    received = resize_nearest_grad.resize_nearest_neighbor_grad(
        grads, size, align_corners, half_pixel
    ).numpy()
    assert received.dtype == expected.dtype and received.shape == expected.shape
    # Exact, floats included: UnsortedSegmentSum on CPU adds the output pixels
    # in the same row-major order as the CPU kernel. (A GPU's sort-based sum
    # may round differently from the CPU, but the same on every run.)
    np.testing.assert_array_equal(received, expected)


@pytest.mark.parametrize("method_args", [{}, {"preserve_aspect_ratio": True}])
def test_resize_gradient_through_tf_image_resize(method_args) -> None:
    images = tf.constant(
        np.random.default_rng(1).standard_normal((2, 5, 7, 3)), tf.float32
    )

    def loss_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.image.resize(x, (11, 16), method="nearest", **method_args)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, x)

    expected = loss_grad(images).numpy()
    assert "ResizeNearestNeighborGrad" in op_types(loss_grad, images)
    with patched(resize_nearest_grad.PATCH):
        received = loss_grad(images).numpy()
        assert "ResizeNearestNeighborGrad" not in op_types(loss_grad, images)
    np.testing.assert_array_equal(received, expected)


# ------------------------------------------------------------------ bincount

from tfdet.patches import bincount  # noqa: E402


@st.composite
def bincount_cases(draw):
    rank = draw(st.integers(1, 2))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=rank, max_size=rank)))
    size = draw(st.integers(0, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    value_dtype = draw(st.sampled_from([np.int32, np.int64]))
    # Values up to 12 include values >= size, which both must drop.
    values = rng.integers(0, 12, shape).astype(value_dtype)
    weight_dtype = draw(
        st.sampled_from([None, np.float32, np.float64, np.int32, np.int64])
    )
    if weight_dtype is None:
        weights = np.array([], np.float32)
    else:
        weights = (rng.standard_normal(shape) * 5).astype(weight_dtype)
    binary = bool(draw(st.booleans()) and weight_dtype is None)
    return values, size, weights, binary


@SWEEP
@given(bincount_cases())
def test_dense_bincount_equals_the_kernel(case) -> None:
    values, size, weights, binary = case
    expected = gen_math_ops.dense_bincount(
        input=values, size=size, weights=weights, binary_output=binary
    ).numpy()
    received = bincount.dense_bincount(values, size, weights, binary).numpy()
    assert received.dtype == expected.dtype and received.shape == expected.shape
    # Exact for integer counts; for float weights too, because the CPU
    # UnsortedSegmentSum adds in input order, as the CPU kernel does.
    np.testing.assert_array_equal(received, expected)


def test_v1_bincount_equals_the_kernel() -> None:
    values = np.array([3, 1, 1, 7, 0, 3, 3], np.int32)
    weights = np.linspace(-1, 2, 7).astype(np.float32)
    for w in (weights, np.array([], np.float32)):
        np.testing.assert_array_equal(
            bincount.bincount(values, 5, w).numpy(),
            gen_math_ops.bincount(arr=values, size=5, weights=w).numpy(),
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"input": [1, -1, 2], "size": 3, "weights": np.array([], np.float32)},
        {"input": [1, 2], "size": -1, "weights": np.array([], np.float32)},
        {"input": [[[1]]], "size": 2, "weights": np.array([], np.float32)},
        {"input": [1, 2], "size": 3, "weights": np.array([1.0], np.float32)},
    ],
    ids=["negative value", "negative size", "rank 3", "weights shape"],
)
def test_bincount_rejects_what_the_kernel_rejects(kwargs) -> None:
    assert_same_error(
        lambda: gen_math_ops.dense_bincount(**kwargs),
        lambda: bincount.dense_bincount(
            kwargs["input"], kwargs["size"], kwargs["weights"]
        ),
    )


def test_tf_math_bincount_and_category_encoding_use_the_patch() -> None:
    keras = pytest.importorskip("keras")
    tokens = tf.constant([[1, 4, 4, 0], [2, 2, 9, 3]])
    layer = keras.layers.CategoryEncoding(num_tokens=10, output_mode="count")

    def count(x):
        return tf.math.bincount(x, minlength=6, axis=-1), layer(x)

    expected = [t.numpy() for t in count(tokens)]
    assert "DenseBincount" in op_types(count, tokens)
    with patched(bincount.PATCH):
        received = [t.numpy() for t in count(tokens)]
        assert "DenseBincount" not in op_types(count, tokens)
    for got, want in zip(received, expected, strict=True):
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------- confusion-matrix scatter

from tfdet.patches import confusion_matrix_scatter  # noqa: E402


@st.composite
def scatter_cases(draw):
    classes = draw(st.integers(1, 6))
    count = draw(st.integers(0, 40))  # 0: empty; many entries: duplicates.
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    indices = rng.integers(0, classes, (count, 2)).astype(
        draw(st.sampled_from([np.int32, np.int64]))
    )
    dtype = draw(st.sampled_from([np.int32, np.int64, np.float32, np.float64]))
    updates = (rng.standard_normal(count) * 10).astype(dtype)
    return indices, updates, [classes, classes]


@SWEEP
@given(scatter_cases())
def test_scatter_nd_equals_the_kernel(case) -> None:
    indices, updates, shape = case
    expected = tf.scatter_nd(indices, updates, shape).numpy()
    received = confusion_matrix_scatter.scatter_nd(indices, updates, shape).numpy()
    assert received.dtype == expected.dtype
    # Exact: duplicates are added in input order on CPU by both.
    np.testing.assert_array_equal(received, expected)


def test_scatter_nd_handles_trailing_axes() -> None:
    indices = np.array([[0], [2], [0]], np.int64)
    updates = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(
        confusion_matrix_scatter.scatter_nd(indices, updates, [3, 4]).numpy(),
        tf.scatter_nd(indices, updates, [3, 4]).numpy(),
    )


@pytest.mark.parametrize("bad", [[[0, 3]], [[-1, 0]]], ids=["too large", "negative"])
def test_scatter_nd_rejects_out_of_range_like_the_kernel(bad) -> None:
    indices = np.array(bad, np.int64)
    assert_same_error(
        lambda: tf.scatter_nd(indices, [1], [3, 3]),
        lambda: confusion_matrix_scatter.scatter_nd(indices, [1], [3, 3]),
    )


def test_confusion_matrices_and_iou_use_the_patch() -> None:
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(3)
    labels = tf.constant(rng.integers(0, 4, 50))
    predictions = tf.constant(rng.integers(0, 4, 50))
    weights = tf.constant(rng.random(50).astype(np.float32))

    from keras.src.metrics import metrics_utils

    def matrices(labels, predictions, weights):
        return (
            tf.math.confusion_matrix(
                labels, predictions, num_classes=4, weights=weights, dtype=tf.float32
            ),
            tf.math.confusion_matrix(labels, predictions),
            # What Keras 3's IoU metrics call.
            metrics_utils.confusion_matrix(
                labels, predictions, 4, weights=weights, dtype="float32"
            ),
        )

    def mean_iou() -> float:
        metric = keras.metrics.MeanIoU(num_classes=4, dtype="float32")
        metric.update_state(labels, predictions, sample_weight=weights)
        return float(metric.result())

    expected = [t.numpy() for t in matrices(labels, predictions, weights)]
    expected_iou = mean_iou()
    assert "ScatterNd" in op_types(matrices, labels, predictions, weights)
    with patched(confusion_matrix_scatter.PATCH):
        received = [t.numpy() for t in matrices(labels, predictions, weights)]
        assert mean_iou() == expected_iou
        assert "ScatterNd" not in op_types(matrices, labels, predictions, weights)
        with pytest.raises(
            tf.errors.InvalidArgumentError
        ):  # TF's own check still runs.
            tf.math.confusion_matrix([0, 5], [0, 1], num_classes=3)
    for got, want in zip(received, expected, strict=True):
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------- adjust_contrast

from tfdet.patches import adjust_contrast  # noqa: E402


@st.composite
def contrast_cases(draw):
    rank = draw(st.integers(3, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    if draw(st.booleans()):  # Empty batches and images.
        shape = (0, *shape[1:]) if rank == 4 else (shape[0], 0, shape[2])
    # float32 only: the CPU kernel has no float16 variant to compare with.
    dtype = np.float32
    scale = draw(st.sampled_from([1.0, 255.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    images = (rng.standard_normal(shape) * scale).astype(dtype)
    factor = draw(st.floats(-2, 3, allow_nan=False, width=32))
    return images, factor


@SWEEP
@given(contrast_cases())
def test_adjust_contrast_equals_the_kernel_within_summation_tolerance(case) -> None:
    images, factor = case
    images = tf.constant(images)
    expected = gen_image_ops.adjust_contrastv2(
        images=images, contrast_factor=factor
    ).numpy()
    received = adjust_contrast.adjust_contrastv2(images, factor).numpy()
    images = images.numpy()
    assert received.dtype == expected.dtype and received.shape == expected.shape
    if images.size == 0:
        return
    # The mean over height x width is summed in another order than the
    # kernel's, so it may differ in its last bits; that error is scaled by
    # (1 + |factor|) in the output. Bound: 4 ulps of the largest input,
    # times (1 + |factor|), in the images' dtype (measured worst: ~1 ulp).
    eps = float(np.finfo(images.dtype).eps)
    bound = 4 * eps * float(np.abs(images).max()) * (1 + abs(factor))
    np.testing.assert_allclose(
        received.astype(np.float64), expected, rtol=0, atol=bound
    )


def test_adjust_contrast_rejects_rank_2_like_the_kernel() -> None:
    images = np.ones((3, 3), np.float32)
    assert_same_error(
        lambda: gen_image_ops.adjust_contrastv2(images=images, contrast_factor=2.0),
        lambda: adjust_contrast.adjust_contrastv2(images, 2.0),
    )


def test_random_contrast_layers_use_the_patch() -> None:
    images = tf.constant(np.random.default_rng(5).random((2, 6, 6, 3)), tf.float32)

    def contrast(x):
        return tf.image.stateless_random_contrast(
            x, 0.5, 1.5, seed=(1, 2)
        ), tf.image.adjust_contrast(x, 1.7)

    expected = [t.numpy() for t in contrast(images)]
    assert "AdjustContrastv2" in op_types(contrast, images)
    with patched(adjust_contrast.PATCH):
        received = [t.numpy() for t in contrast(images)]
        assert "AdjustContrastv2" not in op_types(contrast, images)
    for got, want in zip(received, expected, strict=True):
        # Same tolerance and reason as the property test (inputs in [0, 1)).
        np.testing.assert_allclose(got, want, rtol=0, atol=4 * EPS32 * 2.5)


# --------------------------------------------------- frozen fused batch norm

from tfdet.patches import fused_batch_norm_frozen  # noqa: E402


def _fused_bn_grads(x, scale, offset, mean, var, data_format, training):
    x, scale, offset = (tf.constant(v) for v in (x, scale, offset))
    with tf.GradientTape() as tape:
        tape.watch([x, scale, offset])
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x,
            scale,
            offset,
            mean=None if training else mean,
            variance=None if training else var,
            epsilon=1e-3,
            data_format=data_format,
            is_training=training,
        )
        weights = tf.reshape(
            tf.cast(tf.range(tf.size(y)) % 7 - 3, y.dtype), tf.shape(y)
        )
        loss = tf.reduce_sum(y * weights)
    return [g.numpy() for g in tape.gradient(loss, [x, scale, offset])], weights.numpy()


@st.composite
def batch_norm_cases(draw):
    data_format = draw(st.sampled_from(["NHWC", "NCHW"]))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=4, max_size=4)))
    channels = shape[3] if data_format == "NHWC" else shape[1]
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    scale, offset, mean = (
        rng.standard_normal(channels).astype(np.float32) for _ in range(3)
    )
    var = (rng.random(channels) + 0.1).astype(np.float32)
    return x, scale, offset, mean, var, data_format


@SWEEP
@given(batch_norm_cases())
def test_frozen_batch_norm_gradient_equals_the_kernel(case) -> None:
    x, scale, offset, mean, var, data_format = case
    (dx0, dscale0, doffset0), dy = _fused_bn_grads(
        x, scale, offset, mean, var, data_format, False
    )
    training0, _ = _fused_bn_grads(x, scale, offset, mean, var, data_format, True)
    with patched(fused_batch_norm_frozen.PATCH):
        (dx1, dscale1, doffset1), _ = _fused_bn_grads(
            x, scale, offset, mean, var, data_format, False
        )
        training1, _ = _fused_bn_grads(x, scale, offset, mean, var, data_format, True)
    # is_training=True defers to TensorFlow's own gradient: exactly equal.
    for got, want in zip(training1, training0, strict=True):
        np.testing.assert_array_equal(got, want)
    assert dx1.dtype == dx0.dtype
    # dx is element-wise, dy * (scale * rsqrt(var + eps)), but the kernel's
    # rsqrt (Eigen's) and TF's Rsqrt op may differ by an ulp, and the two
    # products round again: 4 ulps of the dtype, against |dx|max (measured: 2).
    eps_x = float(np.finfo(x.dtype).eps)
    np.testing.assert_allclose(
        dx1, dx0, rtol=0, atol=4 * eps_x * (np.abs(dx0).max() + 1e-30)
    )
    # The sums over N, H, W run in another order than the kernel's: the
    # classic reordering bound is n * eps * sum(|terms|).
    axis = tuple(i for i in range(4) if i != data_format.index("C"))
    shape = [1, 1, 1, 1]
    shape[data_format.index("C")] = -1
    inv = 1 / np.sqrt(var.astype(np.float64) + 1e-3)
    centered = x.astype(np.float64) - mean.reshape(shape)
    n = x.size // len(scale)
    scale_terms = (np.abs(dy.astype(np.float64) * centered)).sum(axis=axis) * inv
    offset_terms = np.abs(dy.astype(np.float64)).sum(axis=axis)
    assert np.all(np.abs(dscale1 - dscale0) <= n * EPS32 * scale_terms + 1e-30)
    assert np.all(np.abs(doffset1 - doffset0) <= n * EPS32 * offset_terms + 1e-30)


def test_frozen_batch_norm_graph_has_no_inference_gradient_op() -> None:
    x = tf.constant(np.random.default_rng(2).standard_normal((2, 3, 3, 4)), tf.float32)
    scale = tf.ones([4])
    offset = tf.zeros([4])

    def grads(x, training):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x,
                scale,
                offset,
                mean=None if training else tf.zeros([4]),
                variance=None if training else tf.ones([4]),
                is_training=training,
            )
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, x)

    assert "FusedBatchNormGradV3" in op_types(lambda x: grads(x, False), x)
    with patched(fused_batch_norm_frozen.PATCH):
        assert "FusedBatchNormGradV3" not in op_types(lambda x: grads(x, False), x)
        # Training mode keeps TensorFlow's (deterministic) gradient kernel.
        assert "FusedBatchNormGradV3" in op_types(lambda x: grads(x, True), x)


# ------------------------------------------------ tf_keras sparse optimizer

from tfdet.patches import sparse_optimizer_update  # noqa: E402


@pytest.mark.parametrize("legacy", [False, True], ids=["Adam", "legacy.Adam"])
def test_tf_keras_sparse_updates_equal_the_scatter_path(legacy: bool) -> None:
    tf_keras = pytest.importorskip("tf_keras")
    rng = np.random.default_rng(4)
    initial = rng.standard_normal((12, 5)).astype(np.float32)
    # Duplicate indices on purpose: scatter adds them one by one, the dense
    # path sums them first.
    steps = [
        tf.IndexedSlices(
            tf.constant(rng.standard_normal((6, 5)).astype(np.float32)),
            tf.constant(rng.integers(0, 12, 6).astype(np.int64)),
            tf.constant([12, 5], tf.int64),
        )
        for _ in range(3)
    ]

    def train() -> tuple[np.ndarray, set[str]]:
        optimizer = (
            tf_keras.optimizers.legacy.Adam if legacy else tf_keras.optimizers.Adam
        )(0.1)
        variable = tf.Variable(initial)

        @tf.function
        def apply(values, indices):
            grad = tf.IndexedSlices(values, indices, tf.constant([12, 5], tf.int64))
            optimizer.apply_gradients([(grad, variable)])

        for grad in steps:
            apply(grad.values, grad.indices)
        concrete = apply.get_concrete_function(steps[0].values, steps[0].indices)
        ops = {n.op_type for n in _scan.walk(concrete.graph.as_graph_def())}
        return variable.numpy(), ops

    expected, original_ops = train()
    assert "ResourceScatterAdd" in original_ops
    with patched(sparse_optimizer_update.PATCH):
        received, patched_ops = train()
    assert not patched_ops & {
        "ResourceScatterAdd",
        "ResourceScatterSub",
        "ResourceScatterUpdate",
    }
    # Same arithmetic, different rounding: the dense path sums duplicate rows
    # before the update and Adam's dense formula rounds differently from its
    # sparse one. After 3 steps of lr 0.1 the weights agree to ~1e-6.
    np.testing.assert_allclose(received, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------ crop_and_resize grad

from tfdet.patches import crop_and_resize_grad  # noqa: E402


@st.composite
def crop_cases(draw):
    batch = draw(st.integers(1, 2))
    height, width = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    depth = draw(st.integers(1, 3))
    boxes_count = draw(st.integers(0, 4))
    crop = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    # Coordinates beyond [0, 1] make crop pixels fall outside the image.
    boxes = rng.uniform(-0.3, 1.3, (boxes_count, 4)).astype(np.float32)
    box_ind = rng.integers(0, batch, boxes_count).astype(np.int32)
    grads = rng.standard_normal((boxes_count, *crop, depth)).astype(np.float32)
    image = rng.standard_normal((batch, height, width, depth)).astype(np.float32)
    return grads, boxes, box_ind, image


@SWEEP
@given(
    crop_cases(),
    st.sampled_from([np.float32, np.float64, np.float16]),
    st.sampled_from(["bilinear", "nearest"]),
)
def test_crop_and_resize_image_grad_equals_the_kernel(case, dtype, method) -> None:
    grads, boxes, box_ind, image = case
    size = list(image.shape)
    expected = gen_image_ops.crop_and_resize_grad_image(
        grads=grads,
        boxes=boxes,
        box_ind=box_ind,
        image_size=size,
        T=dtype,
        method=method,
    ).numpy()
    received = crop_and_resize_grad.crop_and_resize_grad_image(
        grads, boxes, box_ind, size, dtype, method
    ).numpy()
    assert received.dtype == expected.dtype and received.shape == expected.shape
    # Exact: the same float32 weights, cast to the image dtype, added per
    # source pixel in the kernel's loop order (box, row, column, corner).
    np.testing.assert_array_equal(received, expected)


@SWEEP
@given(crop_cases())
def test_crop_and_resize_boxes_grad_equals_the_kernel_within_summation_tolerance(
    case,
) -> None:
    grads, boxes, box_ind, image = case
    expected = gen_image_ops.crop_and_resize_grad_boxes(
        grads=grads, image=image, boxes=boxes, box_ind=box_ind
    ).numpy()
    received = crop_and_resize_grad.crop_and_resize_grad_boxes(
        grads, image, boxes, box_ind
    ).numpy()
    assert received.shape == expected.shape
    if len(grads) == 0:
        return
    # Each box's gradient is a sum over rows x columns x depth that the
    # kernel adds in loop order and `Sum` adds in its own: reordering bound
    # n * eps * sum(|terms|), with |term| <= 2 * max|image| * |grad| * (size - 1)
    # per coordinate (bounded here with 4 * max|image| * |grad| * size).
    n = grads[0].size
    span = max(image.shape[1], image.shape[2])
    terms = (
        4
        * np.abs(image).max()
        * np.abs(grads).reshape(len(grads), -1).sum(axis=1)
        * span
    )
    bound = (n * EPS32 * terms)[:, None]
    assert np.all(np.abs(received - expected) <= bound), (received, expected, bound)


def test_crop_and_resize_gradient_uses_the_patch() -> None:
    rng = np.random.default_rng(6)
    image = tf.constant(rng.standard_normal((2, 9, 9, 3)), tf.float32)
    boxes = tf.constant(
        [[0.1, 0.1, 0.7, 0.9], [0.0, 0.2, 1.0, 0.6], [0.1, 0.1, 0.7, 0.9]], tf.float32
    )
    box_ind = tf.constant([0, 1, 0])

    def grads(image, boxes):
        with tf.GradientTape() as tape:
            tape.watch([image, boxes])
            crops = tf.image.crop_and_resize(image, boxes, box_ind, (4, 5))
            loss = tf.reduce_sum(crops * crops)
        return tape.gradient(loss, [image, boxes])

    expected = [t.numpy() for t in grads(image, boxes)]
    assert {"CropAndResizeGradImage", "CropAndResizeGradBoxes"} <= op_types(
        grads, image, boxes
    )
    with patched(crop_and_resize_grad.PATCH):
        received = [t.numpy() for t in grads(image, boxes)]
        assert not {"CropAndResizeGradImage", "CropAndResizeGradBoxes"} & op_types(
            grads, image, boxes
        )
        with pytest.raises(tf.errors.OutOfRangeError):  # The forward op still checks.
            tf.image.crop_and_resize(image, boxes, [0, 5, 0], (4, 5))
    np.testing.assert_array_equal(received[0], expected[0])
    # Boxes: summation order (see the property test); values here are O(10).
    np.testing.assert_allclose(received[1], expected[1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------- sparse-dense matmul

from tfdet.patches import sparse_dense_matmul  # noqa: E402


@st.composite
def sparse_matmul_cases(draw):
    rows, inner, cols = (draw(st.integers(1, 6)) for _ in range(3))
    nnz = draw(st.integers(0, 15))  # Duplicate coordinates included.
    adjoint_a, adjoint_b = draw(st.booleans()), draw(st.booleans())
    dtype = draw(st.sampled_from([np.float32, np.float64, np.complex64, np.int32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    indices = np.stack(
        [rng.integers(0, rows, nnz), rng.integers(0, inner, nnz)], 1
    ).astype(np.int64)
    values = (rng.standard_normal(nnz) * 4).astype(dtype)
    b_shape = (rows, cols) if adjoint_a else (inner, cols)
    b = (rng.standard_normal(b_shape[::-1] if adjoint_b else b_shape) * 4).astype(dtype)
    return indices, values, np.array([rows, inner], np.int64), b, adjoint_a, adjoint_b


@SWEEP
@given(sparse_matmul_cases())
def test_sparse_dense_matmul_equals_the_kernel(case) -> None:
    indices, values, shape, b, adjoint_a, adjoint_b = case
    expected = gen_sparse_ops.sparse_tensor_dense_mat_mul(
        a_indices=indices,
        a_values=values,
        a_shape=shape,
        b=b,
        adjoint_a=adjoint_a,
        adjoint_b=adjoint_b,
    ).numpy()
    received = sparse_dense_matmul.sparse_tensor_dense_mat_mul(
        indices, values, shape, b, adjoint_a, adjoint_b
    ).numpy()
    assert received.dtype == expected.dtype and received.shape == expected.shape
    # Exact: the same products, added per output row in the order of the
    # sparse entries, as the CPU kernel does.
    np.testing.assert_array_equal(received, expected)


@pytest.mark.parametrize(
    ("indices", "b_shape"),
    [([[0, 3]], (3, 2)), ([[4, 0]], (3, 2)), ([[0, 0]], (2, 2))],
    ids=["column out of range", "row out of range", "inner dimension mismatch"],
)
def test_sparse_dense_matmul_rejects_what_the_kernel_rejects(indices, b_shape) -> None:
    indices = np.array(indices, np.int64)
    shape = np.array([3, 3], np.int64)
    b = np.ones(b_shape, np.float32)
    assert_same_error(
        lambda: gen_sparse_ops.sparse_tensor_dense_mat_mul(
            a_indices=indices, a_values=[1.0], a_shape=shape, b=b
        ),
        lambda: sparse_dense_matmul.sparse_tensor_dense_mat_mul(
            indices, [1.0], shape, b
        ),
    )


def test_sparse_dense_matmul_gradients_use_the_patch() -> None:
    rng = np.random.default_rng(7)
    sparse = tf.sparse.reorder(
        tf.SparseTensor(
            [[0, 1], [2, 0], [2, 3], [1, 1]],
            rng.standard_normal(4).astype(np.float32),
            [3, 4],
        )
    )
    dense = tf.constant(rng.standard_normal((4, 5)), tf.float32)

    def grads(values, dense):
        with tf.GradientTape() as tape:
            tape.watch([values, dense])
            product = tf.sparse.sparse_dense_matmul(
                tf.SparseTensor(sparse.indices, values, sparse.dense_shape), dense
            )
            loss = tf.reduce_sum(product * product)
        return [product, *tape.gradient(loss, [values, dense])]

    expected = [t.numpy() for t in grads(sparse.values, dense)]
    assert "SparseTensorDenseMatMul" in op_types(grads, sparse.values, dense)
    with patched(sparse_dense_matmul.PATCH):
        received = [t.numpy() for t in grads(sparse.values, dense)]
        assert "SparseTensorDenseMatMul" not in op_types(grads, sparse.values, dense)
    np.testing.assert_array_equal(received[0], expected[0])  # Forward: exact.
    # Gradients: the original computes d(values) with its own gather/multiply
    # /sum and d(dense) with another sparse matmul; the patched graph
    # differentiates gather + segment sum instead. Same products, summed in
    # another order: float32 rounding only.
    for got, want in zip(received[1:], expected[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------ cuDNN LSTM/GRU

_RECURRENT_CHILD = """
import hashlib, json, sys
import numpy as np
import tensorflow as tf
from tfdet._graph import _scan
from tfdet.patches.cudnn_rnn import PATCH

out = {}
if LEGACY:
    # Installed before tf_keras is imported: the patch waits for the import.
    PATCH.install()
    out["waited"] = "tf_keras" not in sys.modules
    import tf_keras as keras
    from tf_keras.src.layers.rnn import lstm
    out["patched_on_import"] = hasattr(lstm.lstm_with_backend_selection, "__tfdet_patch__")
    PATCH.restore()
    out["restored"] = not hasattr(lstm.lstm_with_backend_selection, "__tfdet_patch__")
else:
    import keras

tf.random.set_seed(0)
model = keras.Sequential([
    keras.Input((7, 3)),
    keras.layers.LSTM(6, return_sequences=True, go_backwards=True),
    keras.layers.GRU(5),
])
sequence = tf.constant(np.random.default_rng(0).standard_normal((4, 7, 3)), tf.float32)

def step(x):
    with tf.GradientTape() as tape:
        y = model(x, training=True)
        loss = tf.reduce_sum(y * y)
    return [y, *tape.gradient(loss, model.trainable_variables)]

def bits():
    # Forward output and every weight gradient, eagerly and in a tf.function.
    tensors = step(sequence) + tf.function(step)(sequence)
    return [hashlib.sha256(np.asarray(t).tobytes()).hexdigest() for t in tensors]

def gpu_ops():
    # The cuDNN ops a GPU would run, as `tfdet scan` sees them on this CPU.
    with _scan._as_if_on_gpu(model):
        graph = tf.function(step).get_concrete_function(sequence).graph
    return sorted({n.op_type for n in _scan.walk(graph.as_graph_def())
                   if n.op_type.startswith("Cudnn")})

out["before"], out["gpu_ops_before"] = bits(), gpu_ops()
PATCH.install()
out["after"], out["gpu_ops_after"] = bits(), gpu_ops()
PATCH.restore()
out["gpu_ops_restored"] = gpu_ops()
print(json.dumps(out))
"""


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_cudnn_rnn_patch_keeps_the_cpu_bits_and_takes_gpus_off_cudnn(legacy) -> None:
    if legacy:
        pytest.importorskip("tf_keras")
    result = run_python(
        f"LEGACY = {legacy}\n" + _RECURRENT_CHILD,
        # The child imports tf_keras itself; with TF_USE_LEGACY_KERAS=1,
        # `import tensorflow` would import it first and nothing would wait.
        env=clean_env(TF_USE_LEGACY_KERAS="0"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # The forward op and its backprop: CudnnRNNV3 in Keras 3 and tf_keras
    # 2.21, CudnnRNN in tf_keras 2.16.
    cudnn = out["gpu_ops_before"]
    assert len(cudnn) == 2 and sum("Backprop" in op for op in cudnn) == 1, cudnn
    assert out["gpu_ops_restored"] == cudnn
    assert out["gpu_ops_after"] == []
    # The replacement is the implementation a CPU runs anyway: output and
    # gradients are bit-identical with and without the patch (eager and
    # graph), so a CPU's bits do not depend on whether the patch is in force.
    # (On a GPU it replaces cuDNN: equal up to rounding, not measurable here.)
    assert out["after"] == out["before"]
    assert len(set(out["before"])) > 1  # Not all one value: the hashes are real.
    if legacy:
        assert out["waited"] and out["patched_on_import"] and out["restored"]


def test_auto_leaves_the_cpu_only_patches_out_where_a_gpu_is_visible(monkeypatch):
    from tfdet._pin import _devices

    cpu_only = set(_registry.cpu_only_names())
    assert {"fixed_order_products", "pool_size_free_products"} <= cpu_only
    monkeypatch.setattr(_devices, "gpu_visible", lambda: False)
    on_a_cpu = set(_registry.resolve("auto"))
    monkeypatch.setattr(_devices, "gpu_visible", lambda: True)
    on_a_gpu = set(_registry.resolve("auto"))
    # On a GPU its products stay TensorFlow's GPU ops; named, they install.
    assert "fixed_order_products" in on_a_cpu - on_a_gpu
    assert not cpu_only & on_a_gpu
    assert "fixed_order_products" in _registry.resolve(["auto", "fixed_order_products"])
