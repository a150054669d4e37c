"""`tfdet.enable()`: seed everything and pin what decides the bits.

Environment variables this module reads or writes (children inherit writes):

- `PYTHONHASHSEED`: read (only takes effect at interpreter start; a mismatch
  is a warning naming `tfdet run`), then written as `str(seed)`.
- `TF_ENABLE_ONEDNN_OPTS`: written before `import tensorflow` (on, by
  default; `onednn=None` leaves TensorFlow's CPU-dependent choice). Too late
  once TensorFlow is imported with the other state.
- `ONEDNN_MAX_CPU_ISA`: written on x86-64 (oneDNN reads it at its first
  primitive). A lower cap already set is kept as the machine's ceiling.
- `TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`: written, for children.
- `TF_DETERMINISTIC_OPS`, `TF_CUDNN_DETERMINISTIC`: written as "1".
- `XLA_FLAGS`: `--xla_gpu_deterministic_ops=true` appended, and on x86-64
  `--xla_cpu_max_isa` at the level of the oneDNN cap; others kept. XLA reads
  them at its first compilation in the process.
- `TF_USE_LEGACY_KERAS`: read, to seed tf_keras when it is the Keras in use.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings
from typing import Any

from tfdet._errors import ProfileMismatchError, TooLateError
from tfdet._patching import _registry
from tfdet._pin import _cpu_features, _distribution, _environment, _isa, _versions
from tfdet._pin._profile import Profile
from tfdet._pin._settings import (  # noqa: F401  (re-exported)
    DEFAULT_CPU_ISA,
    DEFAULT_ONEDNN,
    DEFAULT_SEED,
    DEFAULT_THREADS,
    MAX_SEED,
    check_isa_supported,
    check_seed,
    check_threads,
    threads_here,
)
from tfdet._setup import _collector, _coverage, _pools
from tfdet.patches import tensorflow_cpu_extensions

_LOG = logging.getLogger("tfdet")

XLA_DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"


def _startup_hash_seed() -> str | None:
    """The PYTHONHASHSEED the interpreter started with, or None if random.

    It is only read at interpreter start. `sys.flags.hash_randomization` is
    the interpreter's own record for seed 0 (tfdet's default), so a value
    written to `os.environ` later by the script is not mistaken for one in
    force; for other seeds the value seen when tfdet is first imported is the
    best evidence available.
    """
    if not sys.flags.hash_randomization:
        return "0"
    if sys.flags.ignore_environment:
        return None
    value = os.environ.get("PYTHONHASHSEED", "").strip()
    if value in ("", "random", "0"):
        # "0" with randomization on was written after start: not in force.
        return None
    return value


_STARTUP_HASH_SEED = _startup_hash_seed()

_active: tuple[dict[str, Any], Profile] | None = None


def _parse_onednn(value: str | None) -> bool | None:
    if value is None or value.strip() == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def _onednn_in_force() -> bool:
    """Whether oneDNN custom ops are on, as TensorFlow decided at import.

    Once TensorFlow is imported, TensorFlow itself is asked: unset, its
    choice follows the CPU's extensions (on with AVX-512 BF16, off on the
    same CPU model exposing AVX2 only), so no rule here could predict it. Before the import, the variable says what it will decide.
    """
    if _versions.tensorflow_imported():
        decided = _environment.onednn_custom_ops()
        if decided is not None:
            return decided
    explicit = _parse_onednn(os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
    return bool(explicit)


def pinned_environment(
    seed: int,
    threads: int | None,
    cpu_isa: str | None,
    onednn: bool | None,
    inter_op_threads: int | None = None,
) -> dict[str, str]:
    """Environment variables that pin the profile in a new process.

    `tfdet run` sets these before starting the interpreter; `enable()` writes
    the ones that still matter so that child processes inherit them.

    Args:
        seed: The profile's seed (becomes PYTHONHASHSEED).
        threads: Thread-pool size for TF's intra-op pool, or None: each
            process's own CPUs (`enable()`'s default; no pool variable is
            written).
        cpu_isa: oneDNN ISA cap, canonical name, or None off x86-64; XLA:CPU
            gets the same cap. A lower cap already in `os.environ` is kept
            (not in the returned dict).
        onednn: Requested oneDNN custom-ops state, or None for TF's default.
        inter_op_threads: The inter-op pool's size; None: `threads`, as the
            default patches (`fixed_order_add_n` among them) size it.

    Returns:
        A dict of variables to set (existing XLA_FLAGS are kept, not clobbered).
    """
    env = {
        "PYTHONHASHSEED": str(seed),
        "TF_DETERMINISTIC_OPS": "1",
        "TF_CUDNN_DETERMINISTIC": "1",
        "XLA_FLAGS": _isa.with_xla_cap(
            _with_xla_determinism(os.environ.get("XLA_FLAGS", "")), cpu_isa
        ),
    }
    if threads is not None:
        env["TF_NUM_INTRAOP_THREADS"] = str(threads)
        env["TF_NUM_INTEROP_THREADS"] = str(inter_op_threads or threads)
    if cpu_isa is not None:
        existing = _isa.current_cap()
        # A lower cap already set is the machine's ceiling: keep it, as
        # enable() does (it warns in the process that reads it).
        if existing is None or _isa.rank(existing) >= _isa.rank(cpu_isa):
            env[_isa.ONEDNN_ISA_VARIABLE] = cpu_isa
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    return env


def _with_xla_determinism(flags: str) -> str:
    parts = flags.split()
    if any(part.startswith("--xla_gpu_deterministic_ops") for part in parts):
        # Respect an explicit choice; `xla_determinism` records what it says.
        return flags
    return " ".join([*parts, XLA_DETERMINISM_FLAG])


def _xla_determinism_in_force() -> bool:
    return XLA_DETERMINISM_FLAG in os.environ.get("XLA_FLAGS", "").split()


def _runtime_started() -> bool:
    """Whether TensorFlow's eager context exists (the first op has run)."""
    if not _versions.tensorflow_imported():
        return False
    from tensorflow.python.eager import context

    return context.context()._initialized  # pylint: disable=protected-access


def _resolve_isa(requested: str | None, strict: bool, started: bool) -> str:
    """Decides the oneDNN cap, writes it to the environment, returns it."""
    if not _isa.applies():
        return _isa.NOT_APPLICABLE
    if requested is None:
        return _isa.current_cap() or "ALL"
    wanted = _isa.normalize(requested)
    existing = _isa.current_cap()
    if existing is not None and _isa.rank(existing) < _isa.rank(wanted):
        warnings.warn(
            f"{_isa.ONEDNN_ISA_VARIABLE}={existing} is already set, below the requested "
            f"cpu_isa={wanted!r}; keeping {existing} as this machine's ceiling. "
            f"Bits will differ from machines pinned at {wanted}.",
            stacklevel=3,
        )
        return existing
    if existing != wanted and started:
        error = TooLateError(
            "cpu_isa",
            f"oneDNN reads {_isa.ONEDNN_ISA_VARIABLE} at its first primitive, and "
            "TensorFlow has already run ops in this process.",
        )
        if strict:
            raise error
        # A model's weights can exist before any oneDNN primitive (conv,
        # matmul) ran; then the cap written now is still read.
        warnings.warn(
            f"{error} (strict=False: wrote {_isa.ONEDNN_ISA_VARIABLE}={wanted} anyway; it "
            "takes effect only if no oneDNN primitive, such as a convolution "
            "or matmul, has run in this process yet. If one has, the bits "
            f"follow the cap it saw ({existing or 'uncapped'}), not the "
            "profile's.)",
            stacklevel=3,
        )
    os.environ[_isa.ONEDNN_ISA_VARIABLE] = wanted
    return wanted


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    import numpy as np
    import tensorflow as tf

    np.random.seed(seed)
    tf.random.set_seed(seed)
    try:
        import keras

        # Also resets Keras 3's global SeedGenerator; default layer seeds come
        # from Python `random` (keras-team/keras#22620), seeded above too.
        keras.utils.set_random_seed(seed)
    except ImportError:  # pragma: no cover - Keras 3 ships with TF >= 2.16
        pass
    if _versions.uses_legacy_keras():
        import tf_keras

        tf_keras.utils.set_random_seed(seed)


def enable(
    seed: int = DEFAULT_SEED,
    *,
    threads: int | None = DEFAULT_THREADS,
    cpu_isa: str | None = DEFAULT_CPU_ISA,
    onednn: bool | None = DEFAULT_ONEDNN,
    patches: str | list[str] | tuple[str, ...] | None = _registry.AUTO,
    strict: bool = True,
) -> Profile:
    """Makes the training that follows bit-for-bit reproducible.

    Call it at the top of the script, before any model, tensor or dataset is
    built. It seeds Python `random`, NumPy, TensorFlow, Keras 3 (and tf_keras
    when `TF_USE_LEGACY_KERAS=1`), turns on op determinism, pins the thread
    pools and the oneDNN ISA, and installs tfdet's deterministic patches:
    by default its own fixed-order kernels for products, convolutions and
    their gradients (shipped with the install), whose bits follow neither the
    thread count, nor the batch, nor the x86 CPU, so that every CPU the
    process may use works and the bits are those of `threads=1`. Where the
    kernels cannot load (a TensorFlow newer than the install knows, no
    compiler), compositions of TensorFlow's ops give the same promise more
    slowly, and a warning says so. Under `tf.distribute` the patches also
    pin the multi-worker collective (RING), the dataset auto-shard policy
    (DATA) and per-replica random seeds, and make `ParameterServerStrategy`
    and the tf.data service's DYNAMIC sharding raise
    `tfdet.NondeterministicError`; the profile's `distribution` section
    records which. It imports TensorFlow with the garbage collector paused
    and then freezes what the import made (`gc.freeze()`): those objects
    live as long as the process, and the collector's walks over them cost a
    small Keras fit's process about 1 s of its 7-8 s on a 2-core EPYC (more
    at a normal exit).

    Example:

    >>> import tfdet
    >>> profile = tfdet.enable(seed=42)          # doctest: +SKIP
    >>> profile.tiers()                          # doctest: +SKIP
    ('this-machine', 'any-thread-count', 'any-x86-cpu', 'any-batch')

    Args:
        seed: Seed for every generator, in [0, 2**32 - 1]; any integer type
            (e.g. `numpy.int64`) is accepted, bool is not.
        threads: Size of TensorFlow's intra-op thread pool, in [1, 1024], or
            None (the default): the CPUs this process may use (its affinity
            mask, capped by its cgroup's CPU quota; one on aarch64, where the
            pool still decided bits in an emulated check). Under the default
            patches the size decides no bit, only the speed. With patches
            whose bits follow the pool (`patches=None`, or a list without
            "pool_size_free_products"), 1 is the count every machine runs
            alike. The inter-op pool has `threads` threads where the
            "fixed_order_add_n" patch (in the default) sums AddN in a fixed
            order, one otherwise (TensorFlow's AddN sums in an order that
            follows which ops ran side by side).
        cpu_isa: Cap on the instruction set of oneDNN and of XLA:CPU's
            generated code on x86-64 (oneDNN's names, e.g. "AVX2",
            "AVX512_CORE"; None leaves it uncapped). Ignored elsewhere. The
            AVX2 default holds the ops oneDNN still computes (batch
            normalization, pooling, softmax, layer normalization) to the
            bits of every x86-64 CPU from Haswell on; tfdet's kernels use the
            CPU's best instructions under any cap, with the same bits. The
            cap also holds TensorFlow's own view of the CPU (which sends
            bfloat16 ops to oneDNN from CPUID), whatever `patches` says.
        onednn: Require oneDNN custom ops on (True, the default on x86-64)
            or off (False, the default on aarch64, where oneDNN's kernels
            follow the SVE vector length); None keeps TensorFlow's default,
            which follows the CPU (on only with AVX-512 VNNI/BF16 or AMX, or
            on a Neoverse V1), so the bits then differ between machines. Set before `import tensorflow`: call enable()
            first, or start the script with `tfdet run`.
        patches: "auto" (the default: the patches these versions need,
            tfdet's kernels among them), None (none), or a list of names from
            `tfdet.patches`, which may include "auto" (`["auto",
            "cudnn_rnn"]` adds an opt-in patch).
        strict: True or False (nothing else). When False, two refusals whose outcome may leave the bits
            as the profile says become warnings; everything else is refused
            as with True. Exactly:
            - `cpu_isa` too late (TensorFlow's runtime started and the cap
              is not yet the requested one): `ONEDNN_MAX_CPU_ISA` is still
              written and the profile records it, with a warning that it
              takes effect only if no oneDNN primitive (convolution, matmul)
              has run yet: oneDNN reads it at its first primitive, and a
              model's weights can exist before one ran. True: `TooLateError`.
            - A repeat call with different arguments: a warning, and the
              active profile is returned unchanged (the first call's settings
              stay in force, so the bits do not change). True:
              `ProfileMismatchError`.
            `threads` and `onednn` too late are `TooLateError` either way:
            the thread pools and TF_ENABLE_ONEDNN_OPTS are fixed once the
            runtime started or TensorFlow was imported, and they decide the
            bits. `strict` is not part of the profile: a repeat call that
            differs only in `strict` is the same no-op as any other repeat
            call.

    Returns:
        The active `tfdet.Profile`.

    Raises:
        ValueError: an argument is out of range, or the CPU lacks `cpu_isa`.
        TooLateError: TensorFlow already started and a setting cannot change
            (`threads`, `onednn`; `cpu_isa` unless strict=False).
        ProfileMismatchError: `enable()` was already called with other
            arguments (a warning instead with strict=False).
    """
    global _active
    request = _request(seed, threads, cpu_isa, onednn, patches, strict)
    if _active is not None:
        return _repeat_call(request, *_active)

    _versions.tensorflow_version()  # Clear ImportError when TF is missing/old.
    _versions.check_keras_version()
    untested = _versions.untested_platform()
    if untested is not None:
        warnings.warn(
            f"tfdet: enable() has not been tested on {untested}, only on Linux "
            "x86-64: the x86 pins (oneDNN's ISA cap, Eigen's cache sizes, "
            "TensorFlow's CPU features) do not apply here, and nothing else was "
            "measured. Run `tfdet check` to see which bits hold.",
            stacklevel=2,
        )
    _pin_onednn(onednn)
    seed, threads = request["seed"], request["threads"]
    with _collector.paused_then_frozen():  # TensorFlow's import, and Keras's.
        started = _runtime_started()
        # Threads first: once the runtime started they always change the
        # bits, so they are the setting a TooLateError should name.
        selected = _registry.resolve(request["patches"])
        threads_in_force = _pools.pin(
            threads, _pools.inter_op_threads(threads, selected), started
        )
        isa_cap = _resolve_isa(request["cpu_isa"], strict, started)

        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
        _pin_variables(seed, threads_in_force, isa_cap)
        _seed_everything(seed)
        installed = _registry.install(selected)
        _cap_tensorflows_view(isa_cap, installed)

    profile = Profile(
        seed=seed,
        intra_op_threads=threads_in_force[0],
        inter_op_threads=threads_in_force[1],
        onednn_opts=_onednn_in_force(),
        cpu_isa=isa_cap,
        op_determinism=True,
        xla_determinism=_xla_determinism_in_force(),
        xla_cpu_isa=_isa.xla_cap_in_force(),
        python_hash_seed=_STARTUP_HASH_SEED,
        **_software_facts(installed),
    )
    _active = (request, profile)
    _LOG.info("tfdet: enabled %s; tiers: %s", profile, ", ".join(profile.tiers()))
    # Which of the model's ops the profile does not cover is known once it
    # is traced: said after the first step Keras trains, or at exit.
    _coverage.watch(profile.to_dict())
    return profile


def _cap_tensorflows_view(isa_cap: str, installed: tuple[str, ...]) -> None:
    """Caps TensorFlow's own view of the CPU's extensions with oneDNN's ISA
    cap, whatever the patches (the `tensorflow_cpu_extensions` patch does it
    when installed).

    TensorFlow sends a bfloat16 op to oneDNN from CPUID, not from the cap;
    with `patches=None`, a `mixed_bfloat16` model's MatMul aborted the whole
    process on an AVX512_BF16 CPU under the AVX2 cap ("could not create a
    primitive descriptor for the inner product forward propagation
    primitive"; TF 2.21.0, Intel Xeon Emerald Rapids). The view decides
    only where bfloat16 ops run, so no float32 bit changes.
    """
    if (
        tensorflow_cpu_extensions.PATCH.name in installed
        or isa_cap in ("ALL", _isa.NOT_APPLICABLE)
        or _cpu_features.unavailable() is not None
    ):
        return
    _cpu_features.VIEW.cap = isa_cap


def _request(
    seed: Any,
    threads: Any,
    cpu_isa: Any,
    onednn: Any,
    patches: Any,
    strict: Any,
) -> dict[str, Any]:
    """`enable()`'s arguments, validated and normalized (ValueError if not)."""
    request = {
        "seed": check_seed(seed),
        # Resolved here: `enable()` and `enable(threads=N)` on N CPUs ask
        # for the same pools, and a repeat call compares them so.
        "threads": threads_here(check_threads(threads)),
        "cpu_isa": check_isa_supported(cpu_isa),
        "onednn": onednn,
        "patches": _normalize_patch_request(patches),
        "strict": strict,
    }
    if not isinstance(strict, bool):
        raise ValueError(
            f"Expected `strict` to be True or False. Received: strict={strict!r} "
            f"(of type {type(strict).__name__})"
        )
    if onednn is not None and not isinstance(onednn, bool):
        raise ValueError(
            f"Expected `onednn` to be True, False or None. Received: onednn={onednn!r}"
        )
    return request


def _same_request(key: str, previous: Any, requested: Any) -> bool:
    """Whether two values of an `enable()` argument ask for the same thing.

    Patches are compared by the names they select: "auto", `("auto",)` and
    the list "auto" selects here are one request (`tfdet check --script`
    pins `("auto",)`; a script may write either).
    """
    if key == "patches":
        return sorted(_registry.resolve(previous)) == sorted(
            _registry.resolve(requested)
        )
    return previous == requested


def _repeat_call(
    request: dict[str, Any], previous: dict[str, Any], profile: Profile
) -> Profile:
    """A second `enable()`: the active profile, or a refusal if it asks otherwise."""
    # `strict` only decides how refusals are reported, so it is not
    # compared: a script under `tfdet run` may pass its own.
    changed = {
        key: (previous[key], request[key])
        for key in request
        if key != "strict" and not _same_request(key, previous[key], request[key])
    }
    if not changed:
        return profile
    error = ProfileMismatchError(
        "tfdet.enable() was already called with other arguments; a process "
        "has one profile. Differences (active, requested): "
        + ", ".join(f"{key}={old!r} vs {new!r}" for key, (old, new) in changed.items())
        + ". Call enable() once, or start a new process.",
        changed,
    )
    if request["strict"]:
        raise error
    warnings.warn(
        f"{error} (strict=False: the active profile stays in force.)",
        stacklevel=3,  # enable()'s caller.
    )
    return profile


def _pin_onednn(onednn: bool | None) -> None:
    """Sets TF_ENABLE_ONEDNN_OPTS, or refuses when TensorFlow decided otherwise."""
    if onednn is None:
        return
    if not _versions.tensorflow_imported():
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
        return
    if _onednn_in_force() != onednn:
        # Always an error, also with strict=False: it decides the bits.
        state = "on" if _onednn_in_force() else "off"
        raise TooLateError(
            "onednn",
            "TF_ENABLE_ONEDNN_OPTS is read at `import tensorflow`, which "
            f"already ran with oneDNN custom ops {state} (unset, TensorFlow "
            "chooses by the CPU), so for this setting enable() must come "
            f"before `import tensorflow`. Or set TF_ENABLE_ONEDNN_OPTS="
            f"{int(onednn)} before Python starts, or pass onednn=None to keep "
            "this CPU's choice (its bits then differ from machines that "
            "choose otherwise).",
        )


def _pin_variables(seed: int, threads: tuple[int, int], isa_cap: str) -> None:
    """Writes the pinned environment variables; warns about a late hash seed.

    `isa_cap` is the cap `_resolve_isa` decided for oneDNN; here it also
    reaches XLA:CPU. Uncapped ("ALL") or off x86-64, nothing is written.
    """
    cpu_isa = None if isa_cap in (_isa.NOT_APPLICABLE, "ALL") else isa_cap
    env = pinned_environment(seed, threads[0], cpu_isa, None, threads[1])
    if env["PYTHONHASHSEED"] != _STARTUP_HASH_SEED:
        warnings.warn(
            f"PYTHONHASHSEED was {_STARTUP_HASH_SEED!r} at interpreter start; the "
            f"profile wants {env['PYTHONHASHSEED']!r}. It only takes effect at "
            "start: run the script as `tfdet run script.py` so that set and dict "
            "iteration orders are pinned too.",
            stacklevel=3,  # enable()'s caller.
        )
    os.environ.update(env)


def _software_facts(installed: tuple[str, ...]) -> dict[str, Any]:
    """The profile's fields that the software decides: the installed patches,
    what they pin under tf.distribute, and the versions."""
    import tensorflow as tf

    patches = _registry.available()
    flavor = _versions.keras_flavor()
    return {
        "patches": installed,
        "kernels": _registry.on_kernels(installed),
        "kernel_origins": _registry.kernel_origins(installed),
        "distribution": _distribution.pinned(
            (patches[name] for name in installed), flavor
        ),
        "keras": flavor,
        "tensorflow_version": tf.__version__,
        "keras_version": _versions.keras_version(),
        "numpy_version": _versions.numpy_version(),
        "python_version": _versions.python_version(),
    }


def _normalize_patch_request(patches: Any) -> Any:
    if patches is None or patches is False or patches is True:
        return patches
    if isinstance(patches, str):
        # "auto", or a bad string: `resolve` says which names exist.
        return patches if patches == _registry.AUTO else _registry.resolve(patches)
    if not isinstance(patches, list | tuple | set | frozenset) or not all(
        isinstance(name, str) for name in patches
    ):
        raise ValueError(
            "Expected `patches` to be 'auto', None, or a list of patch names "
            f"from `tfdet.patches`. Received: patches={patches!r} (of type "
            f"{type(patches).__name__})"
        )
    # Named patches (or a bad string) are checked now, before enable() changes
    # anything: an unknown name is a ValueError with the known ones.
    _registry.resolve(patches)
    return tuple(sorted(set(patches)))


def profile() -> Profile | None:
    """The active profile, or None when `enable()` has not been called."""
    return None if _active is None else _active[1]


def coverage() -> _coverage.Coverage:
    """The ops of this process's traced model that `enable()` does not cover.

    tfdet's tiers hold for the ops it covers. A model may run others:
    TensorFlow's own MatMul on bfloat16 under a mixed-precision policy (the
    kernels take float32 and float64), a 3-D convolution's filter gradient.
    Read from every function the process traced (the Keras train function
    among them: call it after the first step) and from the inputs a patch
    left to TensorFlow. `enable()` logs the same record after the first step
    Keras trains, or at exit.

    Example:

    >>> tfdet.enable()                               # doctest: +SKIP
    >>> model.fit(x, y, epochs=1)                    # doctest: +SKIP
    >>> tfdet.coverage().lost                        # doctest: +SKIP
    ()
    >>> tfdet.profile().tiers(coverage=tfdet.coverage())  # doctest: +SKIP
    ('this-machine', 'any-thread-count', 'any-x86-cpu', 'any-batch')

    Returns:
        A `Coverage`: `uncovered` (each op, what its bits may follow, why it
        was left) and `lost` (the names of the profile's tiers it takes).

    Raises:
        RuntimeError: `enable()` has not been called.
    """
    if _active is None:
        raise RuntimeError("tfdet.coverage() needs tfdet.enable() first")
    return _coverage.measured(_active[1].to_dict())


def is_enabled() -> bool:
    """Whether `tfdet.enable()` is in force in this process."""
    return _active is not None


def observed_profile(seed: int | None = None) -> Profile:
    """Describes the settings in force now, without changing anything.

    Used for runs without `enable()` (e.g. `tfdet check --no-enable`), so that
    their traces still say what decided their bits.
    """
    active = profile()
    if active is not None:
        return active
    import tensorflow as tf

    threading = tf.config.threading
    return Profile(
        seed=-1 if seed is None else seed,
        intra_op_threads=_pools.threads_in_force(
            threading.get_intra_op_parallelism_threads(), "TF_NUM_INTRAOP_THREADS"
        ),
        inter_op_threads=_pools.threads_in_force(
            threading.get_inter_op_parallelism_threads(), "TF_NUM_INTEROP_THREADS"
        ),
        onednn_opts=_onednn_in_force(),
        cpu_isa=(_isa.current_cap() or "ALL")
        if _isa.applies()
        else _isa.NOT_APPLICABLE,
        op_determinism=_environment.op_determinism_enabled(),
        xla_determinism=_xla_determinism_in_force(),
        xla_cpu_isa=_isa.xla_cap_in_force(),
        python_hash_seed=_STARTUP_HASH_SEED,
        **_software_facts(_registry.installed()),
    )
