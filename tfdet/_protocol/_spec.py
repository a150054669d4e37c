"""The names tfdet's parent process and its children agree on.

A leaf module: the child (`tfdet._child._start`) applies the
perturbations (`tfdet._protocol._perturb`), and the perturbations name the kinds
of child; both import these names from here, so neither imports the other
back. (The variables of the `interrupt` perturbation are in
`tfdet._variables`, with tfdet's other environment variables.)
"""

from __future__ import annotations

import dataclasses
import json
import os

from tfdet import _variables
from tfdet._patching._registry import AUTO
from tfdet._pin._settings import DEFAULT_THREADS

# The kinds of child, each with its module (imported only in the child).
CHECK = "check"
LOCATE = "locate"
SCRIPT = "script"
PREFLIGHT = "preflight"
COST = "cost"
KINDS = {
    CHECK: "tfdet._child._worker",
    LOCATE: "tfdet._child._locate_worker",
    SCRIPT: "tfdet._child._script_worker",
    PREFLIGHT: "tfdet._child._preflight",
    COST: "tfdet._child._cost_worker",
}


def resumed_after() -> int | None:
    """The steps recorded before this run was killed, when it resumes; else None."""
    value = os.environ.get(_variables.RESUMED_AFTER)
    return int(value) if value else None


# Every child is `python -m MODULE SPEC_JSON`.
MODULE = "tfdet._child"

# The result of a run whose TARGET cannot be built or trained.
TARGET_ERROR = "target"

# Lines on the progress channel besides `DONE TOTAL`: the TARGET function
# was called, and it returned a model whose first batch fits it; a script's
# run, which builds no TARGET, says when the script first trains instead.
BUILDING = "building"
BUILT = "built"
TRAINING = "training"
STAGES = (BUILDING, BUILT, TRAINING)
# A line on the progress channel that starts so is a child's answer to its
# parent's request (a JSON object: `tfdet cost`'s worker), not progress.
ANSWER_START = "{"


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a child process is told (its argv[1], as JSON).

    Attributes:
        kind: One of `KINDS`: what the process runs.
        seed: The run's seed.
        enable: Whether the process calls `tfdet.enable()`.
        threads: `tfdet.enable(threads=...)` (the `threads` perturbation
            gives some processes another one).
        cpu_isa: `tfdet.enable(cpu_isa=...)`.
        patches: `tfdet.enable(patches=...)`.
        target: The TARGET string (check, locate, preflight, cost).
        steps: Training steps (check, locate).
        workers: Processes of a multi-worker run (check).
        replicas: Replicas of a `MirroredStrategy` in one process (check).
        record: Path of a `tfdet locate --record` trace to write, or None.
        script: Path of the training script (script, cost).
        args: The script's arguments (script, cost).
        script_dir: The directory put first on `sys.path` (script): that
            of the script's real file, as `python script.py` puts it (a
            symbolic link resolved); relative to the run's directory when
            it lies inside it. None: the script's own directory.
        max_steps: Stop the script after this many recorded steps, or None.
        result: Path of the result file (filled in per process).
        trace: Path of the trace file, or the base of a script's trace files
            (filled in per process).
        progress_fd: The descriptor of the progress channel, or None
            (filled in per process).
        resume_dir: Where a run of the `interrupt` perturbation keeps what
            it needs to resume (filled in per process), or None.
        warmup: Untimed training steps before the first answer (cost).
        jit_compile: Set on the TARGET's model before its first step (cost's
            XLA setting), or None to keep what the TARGET compiled with.
        requests_fd: The descriptor the child reads its parent's requests
            from (cost: one JSON line each; the answers go back on the
            progress channel), or None (filled in per process).
        op_determinism: Without tfdet (`enable` False), turn on TensorFlow's
            own op determinism once it is imported (cost's "seeds +
            enable_op_determinism()" setting).
    """

    kind: str
    seed: int = 0
    enable: bool = True
    threads: int | None = DEFAULT_THREADS
    cpu_isa: str | None = None
    patches: tuple[str, ...] = (AUTO,)
    target: str | None = None
    steps: int = 0
    workers: int = 1
    replicas: int = 1
    record: str | None = None
    script: str | None = None
    args: tuple[str, ...] = ()
    script_dir: str | None = None
    max_steps: int | None = None
    result: str = ""
    trace: str = ""
    progress_fd: int | None = None
    resume_dir: str | None = None
    warmup: int = 0
    jit_compile: bool | None = None
    requests_fd: int | None = None
    op_determinism: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"Expected a worker kind from {', '.join(KINDS)}. Received: "
                f"kind={self.kind!r}"
            )
        # JSON gives lists back: the sequences are tuples, so a spec read
        # back equals the one written.
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "patches", tuple(self.patches))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))


# Next to the result: the steps recorded when the interrupt killed the run.
KILLED_SUFFIX = ".killed"
