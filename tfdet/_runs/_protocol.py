"""The names tfdet's parent process and its children agree on.

A leaf module: the child protocol (`tfdet._runs._child`) applies the
perturbations (`tfdet._runs._perturb`), and the perturbations name the kinds
of child and the variables of the `interrupt` perturbation; both import these
names from here, so neither imports the other back.
"""

from __future__ import annotations

import os

# The kinds of child, each with its module (imported only in the child).
CHECK = "check"
LOCATE = "locate"
SCRIPT = "script"
PREFLIGHT = "preflight"
KINDS = {
    CHECK: "tfdet._runs._worker",
    LOCATE: "tfdet._runs._locate_worker",
    SCRIPT: "tfdet._runs._script_worker",
    PREFLIGHT: "tfdet._runs._target",
}

# The `interrupt` perturbation: steps after which the first process is
# killed, and (in the process that resumes) after which it was.
INTERRUPT_VAR = "TFDET_INTERRUPT_AFTER"
RESUMED_VAR = "TFDET_RESUMED_AFTER"


def resumed_after() -> int | None:
    """The steps recorded before this run was killed, when it resumes; else None."""
    value = os.environ.get(RESUMED_VAR)
    return int(value) if value else None
