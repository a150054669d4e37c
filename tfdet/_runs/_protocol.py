"""The names tfdet's parent process and its children agree on.

A leaf module: the child protocol (`tfdet._runs._child`) applies the
perturbations (`tfdet._runs._perturb`), and the perturbations name the kinds
of child; both import these names from here, so neither imports the other
back. (The variables of the `interrupt` perturbation are in
`tfdet._variables`, with tfdet's other environment variables.)
"""

from __future__ import annotations

import os

from tfdet import _variables

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


def resumed_after() -> int | None:
    """The steps recorded before this run was killed, when it resumes; else None."""
    value = os.environ.get(_variables.RESUMED_AFTER)
    return int(value) if value else None
