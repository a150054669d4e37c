"""The protocol between tfdet and the training processes it starts.

Every process `tfdet check`, `check --script`, `locate`, `cost` and the
TARGET preflight start is `python -m tfdet._child SPEC_JSON`, where SPEC_JSON
is one `WorkerSpec`. The child:

1. calls `child_start` first (every kind): `tfdet.enable()` with the spec's
   settings, or only Keras's seeds for a TARGET run without tfdet (and
   TensorFlow's own op determinism where the spec asks for it); every
   perturbation that acts inside the process (`_perturb.applied_in_child`,
   deferred to `import tensorflow` where TensorFlow is not loaded yet);
   the notice of a `jit_compile=True` that Keras dropped;
2. runs its kind (`_worker`, `_locate_worker`, `_script_worker`,
   `_cost_worker`, or the preflight in `_target`), telling the parent its
   steps on a channel of its own (`report_progress`: a pipe whose descriptor
   the spec names, never stdout, which a script may redirect or close), and,
   for a TARGET, when it starts building it and when it has built it
   (`report_stage`), so the parent can tell a TARGET that exits or hangs
   while being built from a run that fails later. A `cost` run also reads
   its parent's requests from a pipe of its own (`next_request`) and
   answers on the progress channel (`answer`);
3. writes one JSON result, atomically (`write_result`), from its own
   process only (a process the script forked never writes it). The result
   carries `perturbations_applied`, so the parent can refuse a run that did
   not apply what the report will claim, and a bad TARGET is reported the
   one way: `{"error": {"kind": "target", "message": ...}}` and exit 2.

Environment variables a child reads (the parent sets them; see
`tfdet._protocol._perturb` and `tfdet._runner._spawn.run_environment`): those of
`tfdet.enable()` and TensorFlow (`TF_NUM_INTRAOP_THREADS`, `ONEDNN_MAX_CPU_ISA`,
`XLA_FLAGS`, `TF_ENABLE_ONEDNN_OPTS`, `TF_USE_LEGACY_KERAS`, `TF_CONFIG`,
`CUDA_VISIBLE_DEVICES`, `TF_CPP_MIN_LOG_LEVEL`), `PYTHONHASHSEED` (at
interpreter start), `TFDET_IMITATE_CACHES` (the `caches` perturbation),
`TFDET_EMULATED_CPU` (`emulated_cpu`), and `TFDET_INTERRUPT_AFTER` / `TFDET_RESUMED_AFTER`
(`interrupt`: the first process kills itself with SIGKILL once that many
steps are recorded, leaving them in `RESULT.killed`; the parent starts a
second one, which resumes and reads from that file how far the first got).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import signal
import sys
import threading
import warnings
from typing import Any

from tfdet import _variables
from tfdet._protocol._spec import (
    KILLED_SUFFIX,
    KINDS,
    PREFLIGHT,
    SCRIPT,
    STAGES,
    TARGET_ERROR,
    WorkerSpec,
)
from tfdet._setup import _collector

# The child's own state: its spec and the process that owns the channels.
_own_spec: WorkerSpec | None = None
_owner_pid: int | None = None
_progress: Any = None
_requests: Any = None
_applied: dict[str, str] = {}
# Perturbations given to this run that it could not apply, with why.
_not_applied: dict[str, str] = {}
# The `interrupt` perturbation in a script: the steps recorded so far, and
# when the script last wrote a backup it could resume from (None: never).
_steps_recorded = 0
_last_backup_at: int | None = None
# `os._exit` itself: a script run replaces it with one that writes the run's
# result first (`_script_worker`), which the child's own end must not call.
_exit_process = os._exit


def is_owner() -> bool:
    """False in a process the script forked: only the run's own one reports."""
    return os.getpid() == _owner_pid


def _tell_parent(line: str) -> None:
    if _progress is not None:
        try:
            _progress.write(f"{line}\n")
            _progress.flush()
        except (OSError, ValueError):
            # Progress is for people: the parent may have stopped reading.
            pass


def answer(message: dict[str, Any]) -> None:
    """Answers the parent's request (a run of the `cost` kind), as one JSON
    line on the progress channel. Unlike progress, an answer that cannot be
    sent is an error: the parent is gone, and the run with it."""
    if _progress is None or not is_owner():
        return
    # The process's peak resident memory so far (Linux counts it in KiB):
    # `tfdet cost` prints it beside the time.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _progress.write(json.dumps({**message, "peak_mb": round(peak_mb, 1)}) + "\n")
    _progress.flush()


def next_request() -> dict[str, Any]:
    """The parent's next request (a run of the `cost` kind); `{"end": true}`
    when it closed its end, or when this run has no request channel."""
    line = _requests.readline() if _requests is not None else ""
    return json.loads(line) if line.strip() else {"end": True}


def report_stage(stage: str) -> None:
    """Tells the parent the TARGET is being built (`BUILDING`) or is (`BUILT`),
    or that a script starts to train (`TRAINING`)."""
    if stage not in STAGES:
        raise ValueError(f"Expected a stage in {STAGES}. Received: {stage!r}")
    if is_owner():
        _tell_parent(stage)


def report_progress(done: int, total: int) -> None:
    """Tells the parent how far this run is (`total` 0: unknown).

    Called once a step is recorded (and, for a resumable run, saved): the
    `interrupt` perturbation kills the process here, as a preemption would.
    """
    global _steps_recorded
    if not is_owner():
        return
    _tell_parent(f"{done} {total}")
    _steps_recorded = done
    if _interrupt_now(done):
        if _own_spec is not None:
            with open(_own_spec.result + KILLED_SUFFIX, "w", encoding="utf-8") as out:
                out.write(str(done))
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _interrupt_now(done: int) -> bool:
    """Whether the `interrupt` perturbation kills this run after step `done`.

    A TARGET's run saves its checkpoint at every step: killed at the step
    asked. A script saves when it chooses (Keras's BackupAndRestore at each
    epoch's end by default): killed at the first step after the step asked
    that follows one of its backups, so that the resumed process restores
    something and has a step to redo (a kill before any backup would test
    a restart from scratch, not a resume).
    """
    wanted = os.environ.get(_variables.INTERRUPT_AFTER)
    if not wanted:
        return False
    if _own_spec is None or _own_spec.kind != SCRIPT:
        return wanted == str(done)
    return (
        done >= int(wanted) and _last_backup_at is not None and done > _last_backup_at
    )


def note_backup() -> None:
    """Called when the script wrote a backup (BackupAndRestore, a checkpoint)."""
    global _last_backup_at
    _last_backup_at = _steps_recorded


def interrupt_not_applied() -> str | None:
    """Why a script's run given `interrupt` was never killed (None: not given).

    Asked when the script ended in the process meant to be killed.
    """
    wanted = os.environ.get(_variables.INTERRUPT_AFTER)
    if not wanted:
        return None
    if _last_backup_at is None:
        return (
            f"the script wrote no backup in its {_steps_recorded} recorded steps "
            "(Keras's BackupAndRestore saves at each epoch's end unless given "
            "save_freq in batches; tf.train.Checkpoint when the script saves), "
            "so there was nothing to resume from"
        )
    return (
        f"no step was recorded after {wanted} steps that followed a backup (the "
        f"last at step {_last_backup_at} of {_steps_recorded}): a longer run or a "
        "more frequent save_freq lets it be interrupted"
    )


def note_not_applied(name: str, reason: str) -> None:
    """Records that this run could not apply perturbation `name`, and why."""
    _not_applied[name] = reason


def _traced_facts() -> dict[str, Any]:
    """What the ops this run traced say, read once: those whose CPU bits
    follow the pool size (`pool_size_ops`, named by a check when the pool
    size separates two runs, with or without `enable()`) and what its
    profile does not cover (`coverage`, empty without `enable()`, whose
    profile promises no tier)."""
    if "tensorflow" not in sys.modules:
        return {"pool_size_ops": [], "coverage": {}}
    from tfdet._patching import _hazards
    from tfdet._pin import _versions
    from tfdet._setup import _coverage, _enable

    op_types = _coverage.executed_op_types()
    active = _enable.profile()
    return {
        "pool_size_ops": list(
            _hazards.pool_size_dependent(op_types, _versions.tensorflow_version())
        ),
        "coverage": {}
        if active is None
        else _coverage.measured(active.to_dict(), op_types=op_types).to_dict(),
    }


def write_result(result: dict[str, Any]) -> None:
    """Writes the run's result atomically: a crashed run leaves none."""
    if _own_spec is None or not is_owner():
        return
    result = {
        **result,
        "perturbations_applied": dict(_applied),
        "perturbations_not_applied": dict(_not_applied),
        **_traced_facts(),
    }
    partial = _own_spec.result + ".tmp"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(result, out)
    os.replace(partial, _own_spec.result)


def seed_without_tfdet(seed: int, workers: int = 1) -> None:
    """What a careful user does without tfdet: Keras's own seeding only (and
    tf_keras's, when it is the Keras in use)."""
    import keras

    from tfdet._pin import _versions

    keras.utils.set_random_seed(seed)
    if _versions.uses_legacy_keras():
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
    elif workers > 1:
        # Keras 3 cannot train multi-worker at all without this fix
        # (keras-team/keras#20585); it changes which value Keras reads
        # shapes from, not the bits of any step.
        from tfdet.patches import keras_multi_worker

        keras_multi_worker.PATCH.install()


def _enable_op_determinism() -> None:
    """TensorFlow's own switch, as its guide says to use it (with seeds)."""
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()


def enable_settings(spec: WorkerSpec) -> dict[str, Any]:
    """`enable()`'s keyword arguments for a run: its seed, threads, ISA cap
    and patches (also what its multiprocessing children are enabled with)."""
    return {
        "seed": spec.seed,
        "threads": spec.threads,
        "cpu_isa": spec.cpu_isa,
        "patches": list(spec.patches),
    }


def _enable(spec: WorkerSpec) -> None:
    """`tfdet.enable()` with the run's seed, threads and ISA cap."""
    from tfdet._setup._enable import enable

    with warnings.catch_warnings():
        # The parent sets each run's PYTHONHASHSEED on purpose (it is one of
        # the perturbations); the warning would fill the stderr tail a failed
        # run is reported with.
        warnings.filterwarnings("ignore", "PYTHONHASHSEED", UserWarning)
        enable(**enable_settings(spec))


def _apply_perturbations() -> None:
    from tfdet._protocol import _perturb

    _applied.update(_perturb.applied_in_child())


def child_start(spec: WorkerSpec) -> None:
    """What every child does before its TARGET or script: see the module doc.

    A script run without tfdet (`check --script`'s, `cost --script`'s) is
    left to seed itself (it is the careful user); TensorFlow is not imported
    for it here, so that the script's own environment settings still come
    first.
    """
    from tfdet._patching import _import_hook

    if spec.enable:
        _enable(spec)
    elif spec.script is None:
        # As enable() imports TensorFlow, so that a run without tfdet pays
        # for its imports what a run with it pays (`tfdet cost` compares them).
        with _collector.paused_then_frozen():
            seed_without_tfdet(spec.seed, spec.workers)
    if spec.op_determinism and not spec.enable:
        # Once TensorFlow is imported (a script imports it itself, after its
        # own settings), before the TARGET or the script's first op.
        _import_hook.when_imported("tensorflow", _enable_op_determinism)
    # In-child perturbations (e.g. another CPU's cache sizes) act once
    # TensorFlow's libraries are loaded and before its first op.
    _import_hook.when_imported("tensorflow", _apply_perturbations)
    if spec.kind != PREFLIGHT:
        from tfdet._child import _xla

        # After enable(), which must precede `import tensorflow` (oneDNN), and
        # before the TARGET compiles: what it asked of XLA. A script without
        # tfdet imports Keras itself, after its own settings.
        if spec.enable or spec.script is None:
            _xla.install()
        else:
            _import_hook.when_imported("keras", _xla.install)


def run_facts(spec: WorkerSpec) -> dict[str, Any]:
    """The profile and environment facts every worker result carries."""
    from tfdet._pin import _cpus, _environment
    from tfdet._setup import _enable

    return {
        "profile": _enable.observed_profile(spec.seed).to_dict(),
        "environment": {
            "affinity": _cpus.affinity(),
            "env": {
                name: os.environ.get(name)
                for name in _environment.DETERMINISM_VARIABLES
            },
        },
    }


def target_of(spec: WorkerSpec) -> str:
    """The TARGET string of a TARGET's run (check, locate, cost): the parent
    always names it."""
    if spec.target is None:
        raise ValueError(
            f"Expected a TARGET in the spec of a {spec.kind} child. Received: "
            "target=None"
        )
    return spec.target


def script_of(spec: WorkerSpec) -> str:
    """The script of a script's run (script, cost): the parent always names it."""
    if spec.script is None:
        raise ValueError(
            f"Expected a script in the spec of a {spec.kind} child. Received: "
            "script=None"
        )
    return spec.script


def _open_channel(fd: int | None, mode: str) -> Any:
    """The progress (`"w"`) or request (`"r"`) channel, or None."""
    if fd is None:
        return None
    # Not inherited by programs the script starts (subprocess closes it).
    os.set_inheritable(fd, False)
    return os.fdopen(fd, mode, encoding="utf-8", closefd=True)


def _resume_where_killed(spec: WorkerSpec) -> None:
    """In the process that resumes a killed run: `TFDET_RESUMED_AFTER` becomes
    the steps the killed process recorded (the file it left beside the
    result), which for a script are past the steps asked (it is killed
    after a backup)."""
    if not os.environ.get(_variables.RESUMED_AFTER) or not spec.result:
        return
    try:
        with open(spec.result + KILLED_SUFFIX, encoding="utf-8") as handle:
            steps = handle.read().strip()
    except OSError:
        return
    if steps.isdigit():
        os.environ[_variables.RESUMED_AFTER] = steps


def main(argv: list[str]) -> int:
    """The entry point of every child: `python -m tfdet._child SPEC_JSON`."""
    import importlib

    global _own_spec, _owner_pid, _progress, _requests
    from tfdet._errors import EXIT_USAGE, TargetError

    _own_spec = WorkerSpec.from_json(argv[1])
    _resume_where_killed(_own_spec)
    _owner_pid = os.getpid()
    _progress = _open_channel(_own_spec.progress_fd, "w")
    _requests = _open_channel(_own_spec.requests_fd, "r")
    module = importlib.import_module(KINDS[_own_spec.kind])
    try:
        return module.run(_own_spec) or 0
    except TargetError as error:
        # Bad input, not a crash: the parent reports it as exit 2.
        write_result({"error": {"kind": TARGET_ERROR, "message": str(error)}})
        return EXIT_USAGE


def exit_without_teardown(status: int) -> None:
    """Ends the child as the interpreter would, less its teardown.

    Freeing TensorFlow's and Keras's modules and objects one by one costs
    1.3-2 s a process on a 2-core EPYC Zen 3 (a fifth of a small model's
    run), and every `check` starts two processes or more. What a normal exit
    does that anyone can see still happens: the exit handlers run (logging's
    flush, multiprocessing's cleanup, a TARGET's or a script's own `atexit`)
    and stdout and stderr are flushed. A run that left a thread of its own
    running (not a daemon) exits the normal way, which waits for it.
    """
    others = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon
    ]
    if others:
        sys.exit(status)
    # CPython's own list of exit handlers, run as `sys.exit` would run them
    # (an exception in one is printed and the next runs).
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # Closed or replaced by the script: nothing left to flush.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    _exit_process(status)
