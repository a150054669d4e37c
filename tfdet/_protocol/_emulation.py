"""An emulated CPU for one run: QEMU's user-mode emulator.

`qemu-x86_64 -cpu MODEL python ...` runs the same TensorFlow binary on a
third implementation of x86 (QEMU's code generator, TCG): it reports MODEL's
vendor, family, model and cache sizes through CPUID, so oneDNN and Eigen
dispatch and block as on that CPU, and it computes the instructions whose
results the x86 manuals leave to each implementation (RSQRTPS, RCPPS)
exactly, where AMD and Intel each approximate their own way. AVX2 and FMA
run; AVX-512 does not. It is not Intel's or AMD's hardware: their own
approximation tables, AVX-512/AMX paths and real cache behaviour are not
reproduced. A process an emulated one starts runs natively (qemu-user does
not follow `execve`), so the emulator is put in front of the run itself.

On aarch64, `qemu-aarch64 -cpu MODEL` runs the run on another ARM core:
QEMU's `neoverse-n1` and the Cortex models have NEON only, `a64fx` and `max`
512-bit SVE, so oneDNN's and Eigen's kernels take another vector unit's
path. A process that runs under qemu-aarch64 already (an aarch64 Python on
an x86 machine, as tfdet's CI runs one) starts its runs through the same
emulator, which takes the model from `QEMU_CPU`.

Installed by the distribution's package (`apt-get install qemu-user`,
Fedora's `qemu-user`); tfdet never downloads it.
"""

from __future__ import annotations

import functools
import platform
import re
import shutil
import subprocess
import sys

from tfdet._pin import _arm, _environment, _isa

EXECUTABLE = "qemu-x86_64"
ARM_EXECUTABLE = "qemu-aarch64"
# Read by qemu-aarch64 when no -cpu is given: how a run of an emulated aarch64
# Python (whose sys.executable runs the emulator itself) gets another model.
ARM_MODEL_VARIABLE = "QEMU_CPU"
# The vector unit of QEMU's aarch64 models, as `_arm.environment_isa` names
# it inside the run (user mode: `max` and `a64fx` default to 512-bit SVE).
_ARM_MODEL_ISA = {
    "a64fx": "sve_512",
    "max": "sve_512",
    "neoverse-n1": "asimd",
    "cortex-a35": "asimd",
    "cortex-a53": "asimd",
    "cortex-a57": "asimd",
    "cortex-a72": "asimd",
    "cortex-a76": "asimd",
}
INSTALL = "apt-get install qemu-user (Debian/Ubuntu) or dnf install qemu-user (Fedora)"
# How much longer an emulated run may take than a native one, for its time
# bound (docs/measurements.md, "Emulation cost").
SLOWDOWN = 10.0
# A default model of each vendor: the other vendor than the host's.
DEFAULT_MODEL = {"AuthenticAMD": "Haswell-v4", "GenuineIntel": "EPYC-Rome"}
# The best oneDNN ISA of QEMU's x86 models, by name prefix (first match).
# TCG runs up to AVX2 and FMA: a model with AVX-512 cannot run emulated.
_MODEL_ISA = (
    ("Skylake-Server", "AVX512_CORE"),
    ("Cascadelake", "AVX512_CORE"),
    ("Cooperlake", "AVX512_CORE"),
    ("Icelake", "AVX512_CORE"),
    ("SapphireRapids", "AVX512_CORE"),
    ("GraniteRapids", "AVX512_CORE"),
    ("KnightsMill", "AVX512_CORE"),
    ("EPYC-Genoa", "AVX512_CORE"),
    ("Haswell", "AVX2"),
    ("Broadwell", "AVX2"),
    ("Skylake-Client", "AVX2"),
    ("EPYC", "AVX2"),
    ("Dhyana", "AVX2"),
    ("SandyBridge", "AVX"),
    ("IvyBridge", "AVX"),
    ("Nehalem", "SSE41"),
    ("Westmere", "SSE41"),
)
# The highest ISA TCG runs.
EMULATED_ISA = "AVX2"
# The lowest a TensorFlow x86-64 wheel runs on: it is built with AVX, and dies
# of SIGILL on a CPU without it (Nehalem, Westmere).
TENSORFLOW_NEEDS = "AVX"


def emulator() -> str:
    """The name of the emulator of this process's architecture."""
    return ARM_EXECUTABLE if _arm.applies() else EXECUTABLE


def executable() -> str | None:
    """The emulator's path, or None when it is not installed."""
    return _which(emulator())


@functools.cache
def _which(name: str) -> str | None:
    return shutil.which(name)


def already_emulated() -> bool:
    """Whether this process runs under a user-mode emulator itself (an
    aarch64 process on an x86 host): its runs start through that emulator."""
    return (
        _arm.applies()
        and _arm.emulated_on(_environment._cpuinfo_fields(("vendor_id",))) is not None
    )


@functools.cache
def version(emulator: str = EXECUTABLE) -> str:
    """The version of QEMU's `emulator` (default: the x86-64 one), e.g. "7.2.22"."""
    found = _which(emulator)
    if found is None:
        return "not installed"
    text = subprocess.run(
        [found, "--version"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"version (\S+)", text)
    return match.group(1) if match else text.strip() or "unknown"


def known_models() -> tuple[str, ...]:
    """The CPU models this architecture's emulator knows (`-cpu help`)."""
    found = executable()
    if found is None:
        return tuple(_ARM_MODEL_ISA) if already_emulated() else ()
    return _models_of(found)


@functools.cache
def _models_of(found: str) -> tuple[str, ...]:
    text = subprocess.run(
        [found, "-cpu", "help"], capture_output=True, text=True, check=False
    ).stdout
    if found.endswith(ARM_EXECUTABLE):
        # "Available CPUs:" then one indented name a line.
        return tuple(
            line.strip() for line in text.splitlines() if line.startswith("  ")
        )
    return tuple(
        line.split()[1]
        for line in text.splitlines()
        if line.startswith("x86 ") and len(line.split()) > 1
    )


def model_isa(model: str) -> str | None:
    """The best oneDNN ISA of QEMU model `model` (on aarch64 its vector unit,
    `sve_512` or `asimd`), or None when not known."""
    if _arm.applies():
        return _ARM_MODEL_ISA.get(model)
    return next((isa for prefix, isa in _MODEL_ISA if model.startswith(prefix)), None)


def runnable_models(cap: str | None) -> list[str]:
    """The models that can run emulated under ISA cap `cap` (None: no cap).

    TCG has no AVX-512, TensorFlow needs AVX, and a pinned cap needs the
    model to have it. On aarch64 (no caps) every model whose vector unit
    tfdet knows.
    """
    if _arm.applies():
        return [model for model in known_models() if model in _ARM_MODEL_ISA]
    lowest = max(_isa.rank(cap) if cap is not None else 0, _isa.rank(TENSORFLOW_NEEDS))
    return [
        model
        for model in known_models()
        if (isa := model_isa(model)) is not None
        and lowest <= _isa.rank(isa) <= _isa.rank(EMULATED_ISA)
    ]


def default_model() -> str:
    """A model of the other vendor than this CPU's; on aarch64, one with
    another vector unit (NEON where this CPU has SVE, SVE where it has not)."""
    if _arm.applies():
        return "neoverse-n1" if _arm.environment_isa() != "asimd" else "max"
    vendor = _environment.cpu_facts().get("cpu_vendor")
    return DEFAULT_MODEL.get(vendor or "", DEFAULT_MODEL["AuthenticAMD"])


def why_unavailable(cap: str | None) -> str | None:
    """Why no run can be emulated here (None: one can).

    Args:
        cap: The ISA cap the runs' profile pins, or None.
    """
    if not sys.platform.startswith("linux") or platform.machine().lower() not in (
        "x86_64",
        "amd64",
        "aarch64",
        "arm64",
    ):
        return "QEMU's user-mode emulation runs on x86-64 and aarch64 Linux only"
    if executable() is None and not already_emulated():
        return f"{emulator()} is not installed: {INSTALL}"
    if cap is not None and _isa.rank(cap) > _isa.rank(EMULATED_ISA):
        return (
            f"the profile pins {_isa.ONEDNN_ISA_VARIABLE}={cap}, above the {EMULATED_ISA} "
            "that QEMU's emulator runs (it has no AVX-512): pass --cpu-isa AVX2 "
            "or lower"
        )
    return None


def check_model(model: str, cap: str | None) -> str:
    """`model`, after checking that it can run emulated under cap `cap`.

    Raises:
        ValueError: QEMU does not know it, or it has AVX-512 (TCG has none)
            or less than the pinned cap; the message lists the models that fit.
    """
    fitting = runnable_models(cap)
    if model in fitting:
        return model
    if model not in known_models():
        why = f"{emulator()} {version(emulator())} does not know it"
    elif model_isa(model) is None:
        why = "its instruction set is not known to tfdet"
    elif _isa.rank(model_isa(model)) > _isa.rank(EMULATED_ISA):  # type: ignore[arg-type]
        why = "it has AVX-512, which QEMU's emulator does not run"
    elif _isa.rank(model_isa(model)) < _isa.rank(TENSORFLOW_NEEDS):  # type: ignore[arg-type]
        why = "it has no AVX, which TensorFlow's x86-64 builds need"
    else:
        why = f"it lacks the pinned ISA cap {cap}"
    raise ValueError(
        f"Expected `emulate_cpu` to name a QEMU CPU model that can run emulated "
        f"here. Received: emulate_cpu={model!r} ({why}). Models that fit: "
        f"{', '.join(fitting) or 'none'}"
    )


def launcher(model: str) -> tuple[str, ...]:
    """The command prefix that runs a process on emulated CPU `model`: none
    where this process is emulated already (`environment` names the model)."""
    if already_emulated():
        return ()
    return (executable() or emulator(), "-cpu", model)


def environment(model: str) -> dict[str, str]:
    """The variables that run a process on emulated CPU `model`: the model
    for the emulator this process runs under, if it does."""
    return {ARM_MODEL_VARIABLE: model} if already_emulated() else {}


def describe(model: str) -> str:
    """How reports name an emulated run: an emulation, never real hardware."""
    return f"QEMU {version(emulator())} user-mode emulation of a {model} CPU"
