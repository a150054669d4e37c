"""Child of `tfdet cost`: one setting, stepping when the parent says.

`python -m tfdet._cost._worker SPEC_JSON` (spec: `target`, or `script` and
`args`; `setting`, `warmup`, `seed`). It applies the setting before
TensorFlow starts. A TARGET is then built and trains `warmup` untimed steps
(tracing, first oneDNN primitives); a script runs whole, paused between
requests (`_cost._script`). Then it answers one JSON line per request read
from stdin:

- `{"steps": N}`: trains N steps, answers `{"ms": [...]}` (each step's
  wall time; `train_on_batch` returns host values, so a step is done when it
  returns);
- `{"profile": N}`: trains N steps under TensorFlow's profiler, answers
  `{"ops": {op type: {"ms": per step, "node": the costliest node}}}`;
- `{"digest": true}`: answers `{"digest": ...}` of its weights (null for a
  script);
- `{"end": true}` (or the end of stdin): exits.

Its first line is `{"ready": true, "xla": ..., "profile": ...}`, or
`{"error": ...}` when the TARGET cannot be built (exit 2) or the script
trains no more than the warm-up. A script that ends by itself adds
`"finished": true` to the answer it was giving. The protocol runs on a
private copy of stdout: what the TARGET or script prints goes to stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from typing import Any

from tfdet._cost import _ops
from tfdet._cost._settings import Setting


def _apply(setting: Setting, seed: int) -> None:
    """The setting, before TensorFlow's runtime starts."""
    if setting.enable is None:
        # Plain TensorFlow: what a careful user does, Keras's seeding only.
        from tfdet._child import _start

        _start.seed_without_tfdet(seed)
        return
    from tfdet._setup._enable import enable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # The report says what each setting pins.
        enable(seed=seed, **setting.enable)


def _digest(model: Any) -> str:
    import numpy as np

    sha = hashlib.sha256()
    for weight in model.get_weights():
        sha.update(np.ascontiguousarray(weight).tobytes())
    return sha.hexdigest()[:16]


class _Stepper:
    """Trains the built TARGET one `train_on_batch` step at a time."""

    def __init__(self, built: Any) -> None:
        self._built = built
        self._step = 0

    def step(self) -> None:
        x, y = self._built.batch(self._step)
        self._built.model.train_on_batch(
            x, y, sample_weight=self._built.sample_weight(self._step)
        )
        self._step += 1

    def timed(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self.step()
            times.append(1000 * (time.perf_counter() - start))
        return times

    def profiled(self, count: int) -> dict[str, dict[str, Any]]:
        profiling = _ops.Profiling()
        profiling.start()
        for _ in range(count):
            self.step()
        return profiling.stop(count)


def main(argv: list[str]) -> int:
    from tfdet._errors import EXIT_USAGE, TargetError

    # The protocol gets its own descriptor; anything else written to stdout
    # (a TARGET's print) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)

    def answer(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    spec = json.loads(argv[1])
    setting = Setting.from_dict(spec["setting"])
    _apply(setting, spec["seed"])
    from tfdet._child import _xla
    from tfdet._setup import _enable
    from tfdet._target import _load

    if spec.get("script") is not None:
        from tfdet._cost import _script

        _xla.install()  # What the script's own compile calls asked of XLA.

        def ready() -> dict[str, Any]:
            return {
                "ready": True,
                "xla": any(entry["effective"] for entry in _xla.compiled),
                "profile": _enable.observed_profile(spec["seed"]).to_dict(),
            }

        return _script.run(spec["script"], spec["args"], spec["warmup"], answer, ready)
    try:
        built = _load.build(spec["target"], seed=spec["seed"])
        _load.check_fits(built, spec["target"])
    except TargetError as error:
        answer({"error": str(error)})
        return EXIT_USAGE
    model = built.model
    if setting.jit_compile is not None:
        # Before the first step, which traces the train function with it.
        # Under op determinism Keras keeps True only where a deterministic
        # XLA lowering exists for every layer.
        model.jit_compile = setting.jit_compile
    stepper = _Stepper(built)
    stepper.timed(spec["warmup"])
    answer(
        {
            "ready": True,
            "xla": bool(getattr(model, "jit_compile", False)),
            "profile": _enable.observed_profile(spec["seed"]).to_dict(),
        }
    )
    for line in sys.stdin:
        request = json.loads(line)
        if "steps" in request:
            answer({"ms": stepper.timed(request["steps"])})
        elif "profile" in request:
            answer({"ops": stepper.profiled(request["profile"])})
        elif "digest" in request:
            answer({"digest": _digest(model)})
        else:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
