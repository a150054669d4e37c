"""`tfdet run`'s profile in the processes its script starts with multiprocessing.

A process the script starts with `multiprocessing`'s "spawn" or
"forkserver" method (a worker pool, a hyper-parameter search) is a fresh
interpreter: it inherits the pinned environment (`TF_DETERMINISTIC_OPS`
included) but not `enable()`, so its first random op would fail for want of
a seed ("Random ops require a seed"), and a pool could wait forever on a
worker whose error does not pickle. Each such child enables tfdet with the
launcher's settings before any of the script's code runs in it. A forked
child is a copy of its parent, enabled already.

The runs of `tfdet check --script` and `cost --script` do the same, and
count the children they start (`started`): a child's training is not
recorded, and the report says so.

A module of its own, not the launcher's: the launcher runs as `__main__`,
and a spawned child finds `enable_in_spawned_child` by its module's name.
"""

from __future__ import annotations

import json
import os

from tfdet import _variables

# The key of tfdet's settings in a spawned child's preparation data.
_PREPARATION_KEY = "tfdet_run_settings"


class _EnableWhenUnpickled:
    """Pickles as a call of `enable_in_spawned_child(settings)`."""

    def __init__(self, settings: str) -> None:
        self.settings = settings

    def __reduce__(self) -> tuple:
        return enable_in_spawned_child, (self.settings,)


# How many "spawn" or "forkserver" children this process has started since
# `give_spawned_children_the_profile`.
started = 0


def give_spawned_children_the_profile(settings: str | None) -> None:
    """Makes every "spawn" or "forkserver" child of this process enable tfdet.

    With `settings` None (a run without tfdet), the children are only
    counted (`started`).

    Such a child first reads the preparation data its parent sends
    (`multiprocessing.spawn.get_preparation_data`: sys.path, the main
    script to import again, ...), then imports the script as
    `__mp_main__`, then runs its target. Unpickling an extra entry of that
    data calls `enable_in_spawned_child`: the child is enabled before any
    of the script's code runs in it. `Process`, `Pool` and
    `concurrent.futures.ProcessPoolExecutor` all start children this way;
    the child's own `spawn.prepare` ignores keys it does not know. Python
    has no public hook for this; a `sitecustomize` on PYTHONPATH would
    shadow the user's own and enable tfdet in every Python program the
    script starts, not only its multiprocessing children.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def get_preparation_data(name: str) -> dict:
        global started
        data = original(name)
        # A forkserver asks once for itself ("ignore"), then once a child.
        if name != "ignore":
            started += 1
        if settings is not None:
            data[_PREPARATION_KEY] = _EnableWhenUnpickled(settings)
        return data

    spawn.get_preparation_data = get_preparation_data


def enable_in_spawned_child(settings: str) -> None:
    """In a spawned child of a `tfdet run` script: enable() as its parent did.

    The child then spawns its own children the same way.
    """
    from tfdet import _notices
    from tfdet._setup._enable import enable

    if os.environ.get(_variables.VERBOSE) != "1":
        _notices.hide_at_import()
    enable(**json.loads(settings))
    give_spawned_children_the_profile(settings)
