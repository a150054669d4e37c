"""Portability record: one weights digest per reference model, per machine.

Usage:
    python benchmarks/portability.py [--models NAME,...] [--jobs N] [--json FILE] [--record]
    python benchmarks/portability.py --across-architectures

Trains a fixed reference set under the default profile (`tfdet.enable(seed=7)`:
pools of every core, tfdet's kernels, oneDNN custom ops on and capped at AVX2
on x86-64; the bits of one thread), each model for 4
`train_on_batch` steps in a fresh `sys.executable` process (tfdet's check
worker, so the training loop is `tfdet check`'s), and prints the sha256 of
its final weights' bytes (16 hex digits) with the CPU facts that can decide
the bits. The reference set: every built-in target (`builtin:bn_gelu` is
Conv2D + BatchNormalization + GELU + Adam with ExponentialDecay, the kind of
model whose weights differed between an AMD EPYC and an Intel Xeon), and the
op survey (`survey:NAME`, `benchmarks/survey_models.py`: one small model per
normalization, activation, loss, optimizer, Keras schedule, pooling,
Embedding, Dropout, attention, LSTM/GRU, `mixed_bfloat16` and `tf.data`
pipeline), which says piece by piece what keeps its bits between machines.

`--record` adds this machine's entry to
`benchmarks/portability_digests.json`, keyed by the CPU facts and software
versions (the models trained now replace their digests in an existing entry;
the others are kept). Only two real machines can say whether a model's bits are portable:
a model counts as portable once two entries with different CPUs (same
software) record the same digest for it. `tests/test_portability.py` checks
this machine against the table (see `compare`). Each entry names the
architecture it was recorded on (`x86_64`, `aarch64`); `--across-architectures`
prints, for the installed TensorFlow and Keras, each model's digests by
architecture and whether they agree.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfdet._commands import _options  # noqa: E402
from tfdet._patching import _registry  # noqa: E402
from tfdet._pin import _environment, _isa, _versions  # noqa: E402
from tfdet._protocol import _emulation, _perturb, _spec  # noqa: E402
from tfdet._runner import _spawn  # noqa: E402
from tfdet._setup import _enable  # noqa: E402
from tfdet._target import _builtins  # noqa: E402

TABLE = REPO / "benchmarks" / "portability_digests.json"
SEED = 7
STEPS = 4
# The facts that must match for two entries to be "the same machine".
CPU_KEYS = (
    "cpu_vendor",
    "cpu_model",
    "cpu_family",
    "cpu_model_number",
    "cpu_stepping",
    "cpu_caches",
    "cpu_count",
    "cpu_isa_best",
)
SOFTWARE_KEYS = ("tensorflow", "keras_version", "numpy", "python", "tfdet_patches")
# The software that decides the bits: entries compare on these. Python and
# NumPy are recorded, not compared: other versions of them changed no digest
# (docs/measurements.md, "AMD EPYC and Intel Xeon, today's profile").
BITS_SOFTWARE_KEYS = ("tensorflow", "keras_version", "tfdet_patches")
# The CPU facts of an entry recorded on an emulated CPU (see `cpu`).
EMULATED_KEYS = ("emulated", "emulated_model", "emulator_version", "host")
# The pool size the default profile's entries are recorded and compared at:
# its bits are those of one thread whatever pool a run had (`--threads`).
# Entries at other sizes are history, from profiles whose bits followed it.
ONE_THREAD = 1
# Small enough for a test (about 25 s on 2 shared cores, fresh processes).
TINY = ("bn_gelu", "embedding", "keras_issue")
SURVEY = REPO / "benchmarks" / "survey_models.py"
SURVEY_PREFIX = "survey:"


@functools.cache
def _survey_names() -> list[str]:
    """`survey:NAME` for each survey model (its module is read once)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("survey_models", SURVEY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [SURVEY_PREFIX + name for name in module.NAMES]


def models() -> list[str]:
    """The reference set: every built-in target, then the op survey."""
    return _builtins.names() + _survey_names()


def expand(names: list[str]) -> list[str]:
    """`names` with the groups "builtin" and "survey" replaced by their models."""
    groups = {"builtin": _builtins.names(), "survey": _survey_names()}
    return [model for name in names for model in groups.get(name, [name])]


def label(name: str) -> str:
    """How a model is named in reports: `builtin:cnn`, `survey:adam`."""
    return name if name.startswith(SURVEY_PREFIX) else f"builtin:{name}"


def target(name: str) -> str:
    """The TARGET that trains model `name` (a TARGET itself when it has a ':')."""
    if ":" in name and not name.startswith(SURVEY_PREFIX):
        return name
    if name.startswith(SURVEY_PREFIX):
        return f"{SURVEY}:{name[len(SURVEY_PREFIX) :]}"
    return f"builtin:{name}"


def cpu(emulated: str | None = None) -> dict[str, Any]:
    """The CPU facts that key the table: this machine's, or an emulated CPU's.

    An emulated entry is named as an emulation (emulator, version, model)
    with the host it ran on, never as the hardware it stands for: also this
    process's own CPU when it runs whole under a user-mode emulator (an
    aarch64 Python under `qemu-aarch64`, `ci/aarch64.py`), whose host is
    then known only by the emulator's description.
    """
    facts = _environment.cpu_facts()
    host = {key: facts[key] for key in CPU_KEYS}
    if emulated is not None:  # One run on QEMU's x86 CPU model `emulated`.
        described, model = _emulation.describe(emulated), emulated
        emulator = _emulation.EXECUTABLE
    elif facts.get("cpu_emulated"):  # This whole process is emulated.
        described, model = facts["cpu_emulated"], facts["cpu_model"]
        emulator = f"qemu-{platform.machine()}"
    else:
        return host
    return {
        "emulated": described,
        "emulated_model": model,
        "emulator_version": _emulation.version(emulator),
        "host": host,
    }


def software() -> dict[str, Any]:
    """The versions and patches the digests depend on (read without importing TF).

    The patches `enable()` installs are part of the profile: entries recorded
    under another set (an older tfdet) are kept as history, never compared.
    """
    import importlib.metadata

    distribution = (_versions.tensorflow_distribution() or ("tensorflow",))[0]
    return {
        "tensorflow": importlib.metadata.version(distribution),
        "keras_version": importlib.metadata.version("keras"),
        "numpy": _versions.numpy_version(),
        "python": _versions.python_version(),
        "tfdet_patches": _registry.resolve("auto"),
    }


def _environment_for(name: str, threads: int | None = None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _environment.DETERMINISM_VARIABLES
    }
    # What `tfdet run` sets before the interpreter starts (PYTHONHASHSEED,
    # pools, the cap); the worker's enable() then pins the rest.
    cap = "AVX2" if _isa.applies() else None
    env.update(_enable.pinned_environment(SEED, threads, cap, _enable.DEFAULT_ONEDNN))
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    if ":" not in name and _builtins.get(name).legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def digest_of(weights_file: str) -> str:
    """sha256 of the weights' bytes, in the model's order, 16 hex digits."""
    import numpy as np

    sha = hashlib.sha256()
    with np.load(weights_file) as arrays:
        for index in range(len(arrays.files)):
            sha.update(np.ascontiguousarray(arrays[f"arr_{index}"]).tobytes())
    return sha.hexdigest()[:16]


def train(
    name: str,
    workdir: str,
    timeout: float = 600.0,
    emulated: str | None = None,
    **profile: Any,
) -> dict[str, Any]:
    """Trains model `name` in a fresh process; its digest and seconds.

    With `emulated` (a QEMU CPU model), the process runs on that emulated CPU.
    `profile` overrides `RunOptions` fields of the default profile (`threads`,
    `patches`), for measurements other than the record.

    Raises:
        RuntimeError: the process failed (its stderr tail in the message).
    """
    run_dir = os.path.join(workdir, re.sub(r"[^\w.-]", "-", name))
    os.makedirs(run_dir)
    # The default profile (enable() with its defaults): stated once, in RunOptions.
    options = _options.RunOptions(
        target=target(name), seed=SEED, steps=STEPS, emulate_cpu=emulated, **profile
    )
    setup = _perturb.RunSetup(0)
    if emulated is not None:
        setup = _perturb.emulated_setup(options.context(_spec.LOCATE, runs=2))
    (outcome,) = _spawn.run_all(
        [setup],
        options.worker_spec(),
        run_dir,
        base_env=_environment_for(name, options.threads),
        timeout=timeout,
    )
    if not outcome.ok:
        raise RuntimeError(
            f"Expected {label(name)} to train. Received: {outcome.reason}.\n"
            f"{outcome.stderr_tail}"
        )
    result = outcome.result  # The run's CheckResult.
    return {
        "digest": digest_of(result.weights_file),
        "seconds": round(outcome.seconds, 1),
        "cpu_isa": result.profile["cpu_isa"],
        "threads": result.profile["intra_op_threads"],
    }


def measure(
    names: list[str], emulated: str | None = None, jobs: int = 1, **profile: Any
) -> dict[str, dict[str, Any]]:
    """`{name: train(name)}`, one fresh process per model, `jobs` at a time.

    The processes side by side share the cores, which changes their seconds,
    not their bits: each runs the profile's pool size. `profile` as for
    `train`.
    """
    from concurrent.futures import ThreadPoolExecutor

    with (
        tempfile.TemporaryDirectory(prefix="tfdet-portability-") as workdir,
        ThreadPoolExecutor(max_workers=jobs) as pool,
    ):
        trained = pool.map(
            functools.partial(train, workdir=workdir, emulated=emulated, **profile),
            names,
        )
        return dict(zip(names, trained, strict=True))


def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The recorded table (`{"machines": []}` when there is none)."""
    if not path.exists():
        return {"machines": []}
    return json.loads(path.read_text(encoding="utf-8"))


def same_software(recorded: dict[str, Any], soft: dict[str, Any]) -> bool:
    """Whether an entry's software is `soft` in what decides the bits."""
    return all(recorded.get(key) == soft.get(key) for key in BITS_SOFTWARE_KEYS)


def threads_of(machine: dict[str, Any]) -> int:
    """The thread-pool size an entry was recorded at (the profile's 1 when
    it does not say: every entry before entries at other sizes)."""
    return machine.get("profile", {}).get("threads", 1)


def portable_models(
    table: dict[str, Any], soft: dict[str, Any], threads: int = 1
) -> dict[str, str]:
    """`{model: digest}` for models recorded identical on >= 2 different CPUs.

    Only entries of real CPUs with the same software (`same_software`) and
    pool size `threads` count (other versions may change the bits on any
    machine, and so may another pool size; an emulated CPU is an imitation,
    evidence but not a machine). A model recorded with two digests under
    these versions is not portable.
    """
    seen: dict[str, dict[str, set[str]]] = {}
    for machine in table["machines"]:
        if (
            not same_software(machine["software"], soft)
            or "emulated" in machine["cpu"]
            or threads_of(machine) != threads
        ):
            continue
        cpu_key = json.dumps(machine["cpu"], sort_keys=True)
        for name, digest in machine["digests"].items():
            seen.setdefault(name, {}).setdefault(digest, set()).add(cpu_key)
    return {
        name: next(iter(by_digest))
        for name, by_digest in seen.items()
        if len(by_digest) == 1 and len(next(iter(by_digest.values()))) >= 2
    }


def compare(
    table: dict[str, Any],
    facts: dict[str, Any],
    soft: dict[str, Any],
    digests: dict[str, str],
    threads: int = 1,
) -> tuple[list[str], list[str]]:
    """This machine's digests at pool size `threads` against the table.

    Returns `(failures, notes)`. A failure: a digest that differs from the
    one recorded for this CPU (same CPU facts, software and pool size: the
    bits must repeat), or from a model recorded identical on two different
    CPUs at that pool size (shown portable). Anything else is a note (a CPU
    or software not in the table, a model not yet shown portable): never a
    failure, since nothing says the bits should match.
    """
    failures: list[str] = []
    notes: list[str] = []
    same = [
        m
        for m in table["machines"]
        if m["cpu"] == facts
        and same_software(m["software"], soft)
        and threads_of(m) == threads
    ]
    for name, digest in digests.items():
        recorded = {m["digests"][name] for m in same if name in m["digests"]}
        if recorded and digest not in recorded:
            failures.append(
                f"{label(name)}: digest {digest} on this CPU; recorded "
                f"{', '.join(sorted(recorded))} for the same CPU and software"
            )
    for name, digest in portable_models(table, soft, threads).items():
        if name in digests and digests[name] != digest:
            failures.append(
                f"{label(name)}: digest {digests[name]}; recorded {digest} on two "
                "or more different CPUs (shown portable)"
            )
    if not same:
        notes.append(
            "this CPU and software are not in the table: digests recorded for "
            "information only (python benchmarks/portability.py --record)"
        )
    return failures, notes


def record(
    table: dict[str, Any],
    facts: dict[str, Any],
    soft: dict[str, Any],
    digests: dict[str, str],
    threads: int = 1,
) -> dict[str, Any]:
    """The table with this machine's entry added or updated (same CPU,
    software and pool size `threads`: the profile's 1, or another size
    measured beside it).

    An existing entry keeps the digests of models not trained now.
    """
    kept: dict[str, str] = {}
    machines = []
    for machine in table["machines"]:
        if (
            machine["cpu"] == facts
            and machine["software"] == soft
            and threads_of(machine) == threads
        ):
            kept.update(machine["digests"])
        else:
            machines.append(machine)
    digests = {**kept, **digests}
    machines.append(
        {
            "cpu": facts,
            "software": soft,
            "architecture": platform.machine(),
            "date": datetime.date.today().isoformat(),
            "profile": {
                "seed": SEED,
                "threads": threads,
                "cpu_isa": "AVX2" if _isa.applies() else None,
                "onednn": _enable.DEFAULT_ONEDNN,
                "steps": STEPS,
            },
            "digests": dict(sorted(digests.items())),
        }
    )
    return {**table, "machines": machines}


def across_architectures(
    table: dict[str, Any], tensorflow: str, keras: str, threads: int = 1
) -> list[tuple[str, dict[str, list[str]], str]]:
    """Each model's digests by architecture, for one TensorFlow and Keras,
    at pool size `threads`.

    On each architecture, the entries with those versions and the patch set
    of the newest of them count: the patches `enable()` installs follow the
    architecture (Eigen's cache sizes are pinned on x86-64 only), and older
    entries under another patch set are history. Entries recorded before the
    architecture was part of an entry were all recorded on x86-64.

    Returns:
        `(model, {architecture: sorted digests}, verdict)` per model recorded
        on two architectures or more, where the verdict is "equal" (one
        digest on every architecture) or "differs".
    """
    by_architecture: dict[str, list[dict[str, Any]]] = {}
    for machine in table["machines"]:
        soft = machine["software"]
        if (soft.get("tensorflow"), soft.get("keras_version")) == (
            tensorflow,
            keras,
        ) and threads_of(machine) == threads:
            architecture = machine.get("architecture", "x86_64")
            by_architecture.setdefault(architecture, []).append(machine)
    seen: dict[str, dict[str, set[str]]] = {}
    for architecture, machines in by_architecture.items():
        # The newest: the latest date, and of one date the last recorded.
        newest = max(
            enumerate(machines), key=lambda pair: (pair[1].get("date", ""), pair[0])
        )[1]
        patches = newest["software"].get("tfdet_patches")
        for machine in machines:
            if machine["software"].get("tfdet_patches") != patches:
                continue
            for name, digest in machine["digests"].items():
                seen.setdefault(name, {}).setdefault(architecture, set()).add(digest)
    rows = []
    for name, found in sorted(seen.items()):
        if len(found) < 2:
            continue
        digests = {arch: sorted(found[arch]) for arch in sorted(found)}
        same = len(set().union(*found.values())) == 1
        rows.append((name, digests, "equal" if same else "differs"))
    return rows


def _print_across_architectures(threads: int) -> None:
    soft = software()
    rows = across_architectures(
        load_table(), soft["tensorflow"], soft["keras_version"], threads
    )
    architectures = sorted({arch for _, digests, _ in rows for arch in digests})
    print(f"| model | {' | '.join(architectures)} | |")
    print("|---" * (len(architectures) + 2) + "|")
    for name, digests, verdict in rows:
        cells = [", ".join(digests.get(arch, ["-"])) for arch in architectures]
        print(f"| `{label(name)}` | {' | '.join(cells)} | {verdict} |")
    equal = sum(verdict == "equal" for *_, verdict in rows)
    print(f"\n{equal} of {len(rows)} models keep their bits across architectures.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        help="Comma-separated names, or the groups builtin and survey (default: "
        f"all: {', '.join(models())}).",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="Also write the results as JSON."
    )
    parser.add_argument(
        "--record", action="store_true", help=f"Add this machine to {TABLE.name}."
    )
    parser.add_argument(
        "--emulate-cpu",
        metavar="MODEL",
        help="Train on QEMU's emulated CPU MODEL (e.g. Haswell-v4) instead: an "
        "entry of its own, named as an emulation.",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="Models trained side by side (default 1): the processes share the "
        "cores, which changes their seconds, not their bits.",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="Thread-pool size of every run (default: the profile's, every core "
        "the process may use). The default profile's bits do not follow it: "
        "every size is compared with, and recorded as, the bits of one thread.",
    )
    parser.add_argument(
        "--across-architectures",
        action="store_true",
        help="Train nothing: print each model's recorded digests by architecture "
        "(x86_64, aarch64) for this TensorFlow and Keras, and whether they agree.",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"Expected --threads of 1 or more. Received: {args.threads}")
    if args.across_architectures:
        _print_across_architectures(ONE_THREAD)
        return 0
    if args.jobs < 1:
        parser.error(f"Expected --jobs of at least 1. Received: {args.jobs}")
    profile: dict[str, Any] = {"threads": args.threads}
    names = expand(args.models.split(",")) if args.models else models()
    known = models()
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(
            f"Expected --models from builtin, survey, {', '.join(models())}. "
            f"Received: {', '.join(unknown)}"
        )
    if args.emulate_cpu is not None:
        why = _emulation.why_unavailable("AVX2")
        if why is not None:
            parser.error(f"Expected an emulator for --emulate-cpu. Received: {why}")
        try:
            _emulation.check_model(args.emulate_cpu, "AVX2")
        except ValueError as error:
            parser.error(str(error))
    facts, soft = cpu(args.emulate_cpu), software()
    for key, value in {**facts, **soft}.items():
        print(
            f"{key}: {' '.join(map(str, value)) if isinstance(value, list) else value}"
        )
    results = measure(names, args.emulate_cpu, args.jobs, **profile)
    for name, result in results.items():
        print(
            f"{label(name):44s} {result['digest']}  ({result['seconds']} s, "
            f"threads={result['threads']}, cpu_isa={result['cpu_isa']})"
        )
    digests = {name: result["digest"] for name, result in results.items()}
    table = load_table()
    failures, notes = compare(table, facts, soft, digests, ONE_THREAD)
    for line in notes + failures:
        print(line)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"cpu": facts, "software": soft, "results": results}, indent=2)
        )
    if args.record:
        TABLE.write_text(
            json.dumps(record(table, facts, soft, digests, ONE_THREAD), indent=2) + "\n"
        )
        print(f"recorded in {TABLE}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
