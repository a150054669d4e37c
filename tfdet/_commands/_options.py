"""What every command that spawns training runs takes: one frozen object.

`tfdet check` and `tfdet locate` (and anything else that trains TARGET in
fresh processes) take a `RunOptions`. Every default is stated here (the
pinned settings' in `tfdet._pin._settings`) and every value is validated
once, when the object is made: the CLI only parses flags and converts them.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from typing import Any

from tfdet._patching._registry import AUTO
from tfdet._pin import _settings
from tfdet._protocol import _emulation, _perturb, _spec
from tfdet._runner import _process
from tfdet._target import _load

DEFAULT_RUNS = 2
DEFAULT_STEPS = 3
DEFAULT_TIMEOUT = 600.0
DEFAULT_DEVICE = "all"
DEFAULT_WORKERS = 1
DEFAULT_REPLICAS = 1
# `tfdet.enable(patches=...)`'s default: the patches these versions need.
DEFAULT_PATCHES = AUTO
# Each worker is a TensorFlow process and each replica a logical CPU device;
# beyond this many a typo (--workers 200) would exhaust the machine, not test it.
MAX_WORKERS = 64
DEVICES = ("cpu", "gpu", "all")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The runs of one command on one device, made once from its options.

    The runner and the comparison take these plain values; nothing below
    the commands reads the options.

    Attributes:
        setups: One `RunSetup` per run: the perturbations each runs under.
        skipped: `{name: why}` for the requested perturbations that do not
            apply to these runs.
        spec: The `WorkerSpec` every process gets (the runner fills in each
            one's result, trace and progress channel).
        environment: The environment every process starts from (before its
            perturbations change it).
    """

    setups: tuple[_perturb.RunSetup, ...]
    skipped: dict[str, str]
    spec: _spec.WorkerSpec
    # Out of the repr: a copy of the parent's environment.
    environment: dict[str, str] = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What to train, how often, where and under which perturbations.

    Field names mirror the CLI flags. Making one validates every field; an
    error names the field the Python way (`` `emulate_cpu` ``, `runs=1`),
    and the CLI says it as the flag (`tfdet._cli.as_flags`).

    Attributes:
        target: The parsed TARGET; a string (or None, the default target) is
            parsed once, here.
        runs: Processes per device (>= 2; `tfdet locate` always uses 2).
        steps: Training steps per run (>= 1).
        device: `"cpu"`, `"gpu"` or `"all"`.
        perturb: Perturbation names from `tfdet._protocol._perturb.KNOWN`.
        enable: Whether the runs call `tfdet.enable()`.
        seed: The runs' seed.
        threads: `tfdet.enable(threads=...)`; only the default without
            `enable`.
        cpu_isa: `tfdet.enable(cpu_isa=...)`.
        patches: `tfdet.enable(patches=...)`: patch names, "auto" among
            them for the patches these versions need (the default, "auto"
            alone); only the default without `enable`.
        timeout: Seconds before a run is killed (finite, > 0).
        attribute: On divergence, re-run to find the perturbation responsible.
        control: Also run the same perturbations without tfdet, so that the
            report says whether they separate plain TensorFlow at all (an
            identical verdict proves little where they do not).
        traces: Directory that keeps every run's trace (`DEVICE/runN.jsonl`,
            `DEVICE/runN-workerK.jsonl` for multi-worker runs), or None.
        workers: Processes per run (>= 1): more than one makes each run a
            `MultiWorkerMirroredStrategy` job of that many workers on
            loopback. CPU only.
        replicas: Replicas per process (>= 1): more than one trains under a
            `MirroredStrategy` over that many logical CPU devices. CPU only.
        emulate_cpu: The QEMU CPU model of the `emulated_cpu` perturbation
            (None: one of the other vendor than this CPU's); naming one
            selects the perturbation.

    Raises:
        ValueError: a field out of range, naming it.
        TargetError: `target` is not a TARGET string.
    """

    target: _load.TargetSpec | str | None = None
    runs: int = DEFAULT_RUNS
    steps: int = DEFAULT_STEPS
    device: str = DEFAULT_DEVICE
    perturb: tuple[str, ...] = _perturb.ALL
    enable: bool = True
    seed: int = _settings.DEFAULT_SEED
    threads: int | None = _settings.DEFAULT_THREADS
    cpu_isa: str | None = _settings.DEFAULT_CPU_ISA
    patches: tuple[str, ...] = (DEFAULT_PATCHES,)
    timeout: float = DEFAULT_TIMEOUT
    attribute: bool = True
    control: bool = False
    traces: str | None = None
    workers: int = DEFAULT_WORKERS
    replicas: int = DEFAULT_REPLICAS
    emulate_cpu: str | None = None

    def without_tfdet(self) -> RunOptions:
        """The same runs and perturbations in plain TensorFlow: the control."""
        return dataclasses.replace(
            self,
            enable=False,
            threads=_settings.DEFAULT_THREADS,
            patches=(DEFAULT_PATCHES,),
            attribute=False,
            control=False,
            traces=None,
        )

    def __post_init__(self) -> None:
        if not isinstance(self.target, _load.TargetSpec):
            self._set("target", _load.parse(self.target))
        self._set("runs", _settings.check_int("runs", self.runs, 2, None))
        self._set("steps", _settings.check_int("steps", self.steps, 1, None))
        for name in ("workers", "replicas"):
            value = _settings.check_int(name, getattr(self, name), 1, MAX_WORKERS)
            self._set(name, value)
        if self.device not in DEVICES:
            raise ValueError(
                f"Expected `device` to be one of {', '.join(DEVICES)}. Received: "
                f"device={self.device!r}"
            )
        if self.workers > 1 and self.replicas > 1:
            raise ValueError(
                "Expected `workers` or `replicas`, not both: a worker of a "
                "MultiWorkerMirroredStrategy job trains one CPU replica. Received: "
                f"workers={self.workers}, replicas={self.replicas}"
            )
        if self.distributed and self.device == "gpu":
            raise ValueError(
                "Expected `device=cpu` (or all) with `workers` or `replicas`: "
                "distributed runs are checked on the CPU only. Received: "
                "device='gpu'"
            )
        self._set("perturb", tuple(_perturb.validate(self.perturb)))
        for name in ("enable", "attribute", "control"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Expected `{name}` to be True or False. Received: "
                    f"{name}={getattr(self, name)!r}"
                )
        seed, threads, cpu_isa = _settings.check_settings(
            self.seed, self.threads, self.cpu_isa
        )
        if not self.enable and threads != _settings.DEFAULT_THREADS:
            raise ValueError(
                "Expected `threads` only with tfdet enabled: `enable=False` runs "
                "plain TensorFlow, whose thread pools follow the cores. Received: "
                f"threads={threads} with `enable=False`. Drop one of them."
            )
        if self.control and not self.enable:
            raise ValueError(
                "Expected `control` only with tfdet enabled: the control runs the "
                "same perturbations without tfdet, which `enable=False` already "
                "does. Received: control=True with `enable=False`."
            )
        self._set("patches", _check_patches(self.patches))
        if not self.enable and self.patches != (DEFAULT_PATCHES,):
            raise ValueError(
                "Expected `patches` only with tfdet enabled: `enable=False` runs "
                f"plain TensorFlow. Received: patches={list(self.patches)} with "
                "`enable=False`. Drop one of them."
            )
        self._set("seed", seed)
        self._set("threads", threads)
        self._set("cpu_isa", cpu_isa)
        self._check_emulated_cpu()
        self._set("timeout", check_timeout(self.timeout))
        if self.traces is not None and not isinstance(self.traces, str):
            raise ValueError(
                f"Expected `traces` to be a directory path. Received: "
                f"traces={self.traces!r}"
            )

    def _check_emulated_cpu(self) -> None:
        if self.emulate_cpu is None:
            return
        if not isinstance(self.emulate_cpu, str):
            raise ValueError(
                "Expected `emulate_cpu` to name a QEMU CPU model. Received: "
                f"emulate_cpu={self.emulate_cpu!r}"
            )
        if _perturb.EMULATED_CPU not in self.perturb:
            self._set("perturb", (*self.perturb, _perturb.EMULATED_CPU))
        cap = self.pinned_cap
        if _emulation.why_unavailable(cap) is None:
            # Where emulation cannot run, the report says why instead.
            _emulation.check_model(self.emulate_cpu, cap)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    @property
    def distributed(self) -> bool:
        """Whether the runs train under a `tf.distribute` strategy."""
        return self.workers > 1 or self.replicas > 1

    @property
    def target_spec(self) -> _load.TargetSpec:
        """The parsed TARGET (`target` is always one after validation)."""
        assert isinstance(self.target, _load.TargetSpec)
        return self.target

    @property
    def pinned_cap(self) -> str | None:
        """The ISA cap the runs pin: None with `enable=False`."""
        return self.cpu_isa if self.enable else None

    def context(
        self, kind: str = _spec.CHECK, runs: int | None = None
    ) -> _perturb.Context:
        """The planning context of these runs: what the perturbations need.

        Args:
            kind: The kind of child the runs are (`_spec.CHECK`, `LOCATE`,
                `SCRIPT`): it decides whether and when a run can be
                interrupted, and whether it can predict.
            runs: How many runs (default: `runs`).
        """
        base = _perturb.context(
            self.runs if runs is None else runs,
            self.pinned_cap,
            self.threads,
            self.emulate_cpu,
            self.workers,
        )
        if kind == _spec.SCRIPT:
            return dataclasses.replace(
                base,
                interrupt_after=_perturb.SCRIPT_INTERRUPT_AFTER,
                interrupt_after_a_backup=True,
                not_predicting="a script predicts what it chooses: tfdet predicts "
                "a TARGET's model",
            )
        not_predicting = None
        if kind != _spec.CHECK:
            not_predicting = "tfdet locate compares training steps"
        elif self.distributed:
            not_predicting = "not for `workers` or `replicas`"
        reason = None
        if kind != _spec.CHECK:
            reason = "tfdet locate does not interrupt its runs"
        elif self.steps < 2:
            reason = "needs 2 steps or more: one before the interruption, one after"
        elif self.distributed:
            reason = (
                "not for `workers` or `replicas`: tf.distribute resumes its own way"
            )
        elif self.target_spec.legacy_keras:
            reason = (
                "not for tf_keras TARGETs: tf_keras's Dropout keeps its random state "
                "in a kernel no checkpoint can save"
            )
        return dataclasses.replace(
            base,
            interrupt_after=max(1, self.steps // 2),
            not_resumable=reason,
            not_predicting=not_predicting,
        )

    def plan(
        self,
        kind: str = _spec.CHECK,
        device: str = "cpu",
        *,
        runs: int | None = None,
        names: Sequence[str] | None = None,
        environment: dict[str, str] | None = None,
        **spec_fields: Any,
    ) -> RunPlan:
        """The runs of `kind` on `device`: setups, skipped, spec, environment.

        Args:
            kind: The kind of child (`_spec.CHECK`, `LOCATE`, `SCRIPT`).
            device: `"cpu"` or `"gpu"`.
            runs: How many runs (default: `runs`).
            names: The perturbations (default: `perturb`).
            environment: The processes' base environment (default: the
                TARGET's on `device`, `_process.run_environment`).
            **spec_fields: What the worker spec adds for this kind (a
                script, a record path): see `worker_spec`.
        """
        context = self.context(kind, runs)
        names = self.perturb if names is None else names
        return RunPlan(
            setups=tuple(_perturb.plan(context, names)),
            skipped=_perturb.skipped(context, names),
            spec=self.worker_spec(kind, **spec_fields),
            environment=(
                _process.run_environment(self.target_spec, device)
                if environment is None
                else environment
            ),
        )

    def worker_spec(self, kind: str = _spec.CHECK, **fields: Any) -> _spec.WorkerSpec:
        """The spec every process of a run of these options gets.

        The settings every kind pins (seed, enable, threads, cpu_isa) come
        from the options; a TARGET's runs (check, locate) also get its
        target, steps, workers and replicas; `fields` add the rest (a
        script, a record path). The spawner fills in each process's result,
        trace and progress channel (and the pool size of a `threads`
        perturbation).
        """
        if kind in (_spec.CHECK, _spec.LOCATE):
            fields = {
                "target": self.target_spec.text,
                "steps": self.steps,
                "workers": self.workers,
                "replicas": self.replicas,
                **fields,
            }
        return _spec.WorkerSpec(
            kind,
            seed=self.seed,
            enable=self.enable,
            threads=self.threads,
            cpu_isa=self.cpu_isa,
            patches=self.patches,
            **fields,
        )


def _check_patches(patches: Any) -> tuple[str, ...]:
    """Patch names for `tfdet.enable(patches=...)`, checked before any run.

    Raises:
        ValueError: not a string or a list of names, or an unknown name.
    """
    from tfdet._patching import _registry

    names = [patches] if isinstance(patches, str) else patches
    if not isinstance(names, list | tuple) or not all(
        isinstance(name, str) for name in names
    ):
        raise ValueError(
            'Expected `patches` to be a list of patch names, "auto" among them '
            f"for the patches these versions need. Received: patches={patches!r}"
        )
    _registry.resolve(list(names))  # A ValueError naming the known patches.
    return tuple(dict.fromkeys(names))


def check_timeout(timeout: Any) -> float:
    """A run timeout in seconds: a finite number > 0 that a timer can wait.

    NaN would make every run time out at once and infinity overflows the
    timer, so both are refused here.

    Raises:
        ValueError: naming `timeout` and the accepted range.
    """
    try:
        if isinstance(timeout, bool):
            raise TypeError
        value = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(
            f"Expected `timeout` to be a number of seconds. Received: timeout={timeout!r}"
        ) from None
    if not math.isfinite(value) or not 0 < value <= threading.TIMEOUT_MAX:
        raise ValueError(
            f"Expected `timeout` in seconds, finite and > 0. Received: timeout={timeout!r}"
        )
    return value
