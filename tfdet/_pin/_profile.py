"""`tfdet.Profile`: everything that decides the bits and can be pinned."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tfdet._pin import _tiers


@dataclasses.dataclass(frozen=True)
class Profile:
    """The settings that decide the bits of a training run.

    Two runs with equal profiles on conforming machines give the same bits.
    `tfdet.enable()` returns one, every trace records one, `tfdet diff`
    compares them field by field.

    Attributes:
        seed: Seed of Python `random`, NumPy, TensorFlow and Keras.
        intra_op_threads: Size of TensorFlow's intra-op thread pool (0 means
            TensorFlow's default, which follows the machine's cores).
        inter_op_threads: Size of the inter-op thread pool (0: default).
        onednn_opts: Whether TensorFlow's oneDNN custom ops are on.
        cpu_isa: oneDNN's maximum ISA, or "not applicable" off x86-64.
        op_determinism: Whether `enable_op_determinism()` is in force.
        xla_determinism: Whether `--xla_gpu_deterministic_ops=true` is in
            `XLA_FLAGS`.
        python_hash_seed: `PYTHONHASHSEED` the interpreter started with, or
            None when hashing is randomized.
        patches: Names of the tfdet patches installed, sorted.
        keras: "keras3" or "tf_keras".
        tensorflow_version: Version of TensorFlow.
        keras_version: Version of the Keras in use.
        numpy_version: Version of NumPy.
        python_version: Version of Python.
        xla_cpu_isa: XLA:CPU's ISA cap (`--xla_cpu_max_isa`), "none" when
            XLA-compiled CPU code uses the CPU's best instructions (with the
            reason where TensorFlow has no such cap), "not applicable" off
            x86-64; None in profiles recorded before it existed.
        distribution: What decides the bits under `tf.distribute`, as
            `(setting, value)` pairs sorted by setting: the multi-worker
            collective implementation, the dataset auto-shard policy, whether
            replicas draw their own random values, and the constructs refused
            (see `tfdet._pin._distribution.pinned`). Empty in profiles
            recorded before it existed.
        kernels: The installed patches whose compiled kernel (tfdet's C++
            ops) loaded, sorted. A kernel patch in `patches` but not here
            had no cached build and no compiler, and computes its ops as a
            composition of TensorFlow's ops: for `fixed_order_products` and
            `fixed_order_convolutions`, other bits. None in profiles
            recorded before it existed.
        kernel_origins: Where each loaded kernel library came from, as
            `(library, origin)` pairs sorted: "wheel" (shipped in tfdet's
            wheel), "install" (built when tfdet was installed from source)
            or "cache" (built at first use). It decides no bit (the same
            sources and flags; the compiler fixes no order the sources
            leave open), so `differences` leaves it out. Empty where none
            loaded, and in profiles recorded before it existed.
    """

    seed: int
    intra_op_threads: int
    inter_op_threads: int
    onednn_opts: bool
    cpu_isa: str
    op_determinism: bool
    xla_determinism: bool
    python_hash_seed: str | None
    patches: tuple[str, ...]
    keras: str
    tensorflow_version: str
    keras_version: str | None
    numpy_version: str
    python_version: str
    distribution: tuple[tuple[str, str], ...] = ()
    xla_cpu_isa: str | None = None
    kernels: tuple[str, ...] | None = None
    kernel_origins: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        data = dataclasses.asdict(self)
        data["patches"] = list(self.patches)
        data["distribution"] = dict(self.distribution)
        data["kernel_origins"] = dict(self.kernel_origins)
        if self.kernels is not None:
            data["kernels"] = list(self.kernels)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Inverse of `to_dict`; unknown keys are ignored, missing ones raise
        (except fields with a default, added after the first traces).

        Raises:
            ValueError: a field without a default is missing.
        """
        fields = dataclasses.fields(cls)
        names = [field.name for field in fields]
        missing = [
            field.name
            for field in fields
            if field.name not in data and field.default is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(
                f"Expected a tfdet profile with fields {names}. Missing: {missing}"
            )
        values = {name: data[name] for name in names if name in data}
        values["patches"] = tuple(values["patches"])
        if values.get("kernels") is not None:
            values["kernels"] = tuple(values["kernels"])
        for pairs in ("distribution", "kernel_origins"):
            values[pairs] = tuple(sorted(dict(data.get(pairs, {})).items()))
        return cls(**values)

    def differences(self, other: Profile) -> dict[str, tuple[Any, Any]]:
        """`{field: (self value, other value)}` for every field that decides
        bits and differs: all but `kernel_origins` (the same sources and
        flags), and but the pool sizes where neither profile's bits follow
        them (the default's: another core count, the same bits)."""
        mine, theirs = self.to_dict(), other.to_dict()
        free = {"kernel_origins"}
        if not _tiers.follows_threads(mine) and not _tiers.follows_threads(theirs):
            free |= {"intra_op_threads", "inter_op_threads"}
        return {
            name: (mine[name], theirs[name])
            for name in mine
            if mine[name] != theirs[name] and name not in free
        }

    def tiers(
        self, xla: bool = False, device: str = "cpu", coverage: Any = None
    ) -> tuple[str, ...]:
        """The guarantees this profile gives, by tier name (`tfdet._pin._tiers`):
        e.g. `("this-machine", "any-thread-count", "any-x86-cpu",
        "any-batch")` for the default `enable()` on an x86-64 CPU.

        Args:
            xla: Whether the training compiles with XLA (whose CPU code has an
                instruction-set cap of its own).
            device: "cpu" or "gpu", the device the training runs on.
            coverage: A model's `tfdet.coverage()`: the tiers its uncovered
                ops take are left out. None: the tiers for the ops tfdet
                covers.
        """
        lost = () if coverage is None else coverage.lost
        return tuple(
            tier.name
            for tier in _tiers.given(self.to_dict(), xla, device)
            if tier.name not in lost
        )

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
