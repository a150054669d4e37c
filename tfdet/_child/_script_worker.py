"""Child side of `tfdet check --script`: run a user's training script as is.

Runs in a fresh process started by `tfdet._child._start` (kind `script`), in
an environment the parent has pinned and perturbed. It starts as every child
does (`_start.child_start`: tfdet enabled unless the spec says not to, the
in-child perturbations), installs the recording hooks (`_script_hooks`:
one trace per `fit` call, per model's `train_on_batch`, per optimizer's
custom loop, kept by a `_script_recorder.Recorder`), and runs the script as
`python script.py args` would (`runpy.run_path(..., run_name="__main__")`,
`sys.argv` set), with its own copy of any training-state path outside its
directory (`_own_copies`).

At exit the final digest of every variable trained is taken. The result
(written atomically at `spec.result`) lists the traces, the final
digests, the entry points exercised, the step count, the XLA facts and how
the script ended; only the run's own process writes it (a process the
script forked never does), before the process exits when the script ends
with `os._exit(0)`. A script that raises or exits non-zero makes this process
exit non-zero (1, or the script's status) after printing its traceback, so
the parent reports the run as failed with its stderr tail.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from tfdet._child import _own_copies, _script_hooks, _start
from tfdet._child._script_recorder import (
    CUSTOM,
    CUSTOM_COMPILED,
    MaxStepsReached,
    Recorder,
    final_digests,
)
from tfdet._protocol._spec import WorkerSpec
from tfdet._setup import _spawned


def _keras_of(model: Any) -> str:
    """`"tf_keras"` or `"Keras 3"`: the Keras a model is built with."""
    return "tf_keras" if type(model).__module__.startswith("tf_keras") else "Keras 3"


def _print_script_traceback(error: BaseException, script: str) -> None:
    """The traceback as `python script.py` prints it: from the script's frame."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb or error.__traceback__)
    sys.stderr.flush()


def _hook_os_exit(finish: Callable[[str], None]) -> None:
    """Makes the script's `os._exit(0)` write the run's result first.

    `os._exit` skips everything after it, the result this process writes
    when the script returns included; a script that ends that way (to skip
    slow interpreter shutdown, or threads that never end) would be a failed
    run. `finish(end)` writes the result from what was recorded so far. A
    non-zero status is the script's failure, reported as such; a process the
    script forked exits at once (it never writes the run's result).
    """
    real_exit = os._exit

    @functools.wraps(real_exit)
    def _exit(status: int) -> NoReturn:
        if status == 0 and _start.is_owner():
            sys.stdout.flush()
            try:
                finish(f"called os._exit({status})")
            except BaseException:  # noqa: BLE001 - then the run fails with it
                traceback.print_exc()
                status = 1
            sys.stderr.flush()
        real_exit(status)

    os._exit = _exit


def run(spec: WorkerSpec) -> int:
    """Runs the script under the hooks; writes the result; returns the exit status."""
    started = time.perf_counter()
    _own_copies.run_directory = os.getcwd()
    _start.child_start(spec)
    # Its multiprocessing children start as `tfdet run`'s do: enabled with
    # the run's settings before the script's code runs in them.
    _spawned.give_spawned_children_the_profile(
        json.dumps(_start.enable_settings(spec)) if spec.enable else None
    )
    recorder = Recorder(spec.trace, spec.max_steps)
    if spec.enable:
        _script_hooks.install(recorder)
    else:
        _script_hooks.install_at_first_import(recorder)
    script = _start.script_of(spec)
    sys.argv = [script, *spec.args]
    # As `python script.py`: sys.path[0] is the directory of the script's
    # real file (the run's copy of a linked script is not a link).
    sys.path[0] = os.path.abspath(
        spec.script_dir or os.path.dirname(os.path.realpath(script))
    )
    _hook_os_exit(
        lambda end: _write_result(spec, recorder, end, time.perf_counter() - started)
    )
    end, status = "completed", 0
    try:
        runpy.run_path(script, run_name="__main__")
    except MaxStepsReached:
        end = f"stopped at --max-steps {recorder.max_steps}"
    except SystemExit as exit_:
        code = exit_.code
        if code not in (None, 0):
            end = f"called sys.exit({code!r})"
            status = code if isinstance(code, int) else 1
            if not isinstance(code, int):
                # What the interpreter itself does with sys.exit("message"),
                # so the run's stderr is the one `python train.py` gives.
                sys.stderr.write(f"{code}\n")
    except BaseException as error:  # noqa: BLE001 - the script's failure is the report
        _print_script_traceback(error, script)
        from tfdet._errors import ProfileMismatchError

        if isinstance(error, ProfileMismatchError):
            # The script's own enable() asks for other settings than the
            # runs pinned: say which flags make them agree.
            from tfdet._setup._launch import mismatch_message

            hint = mismatch_message(error).replace("tfdet run", "tfdet check --script")
            logging.getLogger("tfdet").error("tfdet: %s", hint)
        end = "raised"
        status = 1
    if not _start.is_owner():
        # A process the script forked, ending here: only the run's own
        # process reports (and Python's exit handlers are the parent's).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status if isinstance(status, int) else 1)
    if status:
        sys.stderr.flush()
        return status
    _write_result(spec, recorder, end, time.perf_counter() - started)
    return 0


def _write_result(
    spec: WorkerSpec, recorder: Recorder, end: str, seconds: float
) -> None:
    """Writes the run's result: how it ended, its traces and final digests."""
    for trace in recorder.traces:
        if trace.callback is not None:
            # Whole already (each line is flushed); closed for a fit that
            # `os._exit` ended.
            trace.callback._close()
    not_interrupted = _start.interrupt_not_applied()
    if not_interrupted is not None:
        # The run meant to be killed and resumed finished whole: it is an
        # uninterrupted run, and the report says why.
        from tfdet._protocol import _perturb

        # Under either name that kills and resumes (the parent keeps the
        # one its run was given).
        for name in (_perturb.INTERRUPT, _perturb.MIGRATE):
            _start.note_not_applied(name, not_interrupted)
    from tfdet._child import _xla

    result = {
        **(_start.run_facts(spec) if spec.enable else {"profile": None}),
        "script": spec.script,
        "args": list(spec.args),
        "end": end,
        "traces": [trace.to_dict() for trace in recorder.traces],
        "entry_points": recorder.entry_points,
        # Which Keras the trained models came from: the script's own choice.
        # A custom loop's Keras is its optimizer's (its model is not seen).
        "keras": sorted(
            {_keras_of(model) for model in recorder.models}
            | {
                _keras_of(trace.key)
                for trace in recorder.traces
                if trace.kind in (CUSTOM, CUSTOM_COMPILED)
            }
        ),
        "steps_recorded": sum(t.steps_recorded() for t in recorder.traces),
        "final_weights": final_digests(recorder),
        "xla": _xla.facts(recorder.models),
        "own_copies": dict(_own_copies.own_copies),
        "spawned": _spawned.started,
        "seconds": seconds,
    }
    _start.write_result(result)
