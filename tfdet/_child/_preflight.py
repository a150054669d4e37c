"""The preflight child: builds the TARGET once before the runs start.

A TARGET that cannot be built or fed is reported once, as a bad TARGET
(exit 2), instead of by every run.
"""

from __future__ import annotations

from typing import Any

from tfdet._child import _start
from tfdet._protocol import _spec
from tfdet._target import _load


def run(spec: Any) -> None:
    """The preflight child (kind `preflight`).

    Builds the TARGET and checks its first batch; a TARGET it refuses is a
    `TargetError`, which the child reports as a bad TARGET.
    """
    # As in the runs, where tfdet imports Keras before the TARGET: a TARGET
    # that picks its Keras too late is found here (exit 2), not in every run.
    import keras  # noqa: F401

    _start.report_stage(_spec.BUILDING)
    built = _load.build(spec.target)
    _load.check_fits(built, spec.target)
    _start.report_stage(_spec.BUILT)
    _start.write_result({"error": None})
