"""`threads` (opt-in): another thread-pool size, a setting rather than a machine."""

from __future__ import annotations

from tfdet._pin._settings import threads_here
from tfdet._protocol._perturb._records import Change, Context, Perturbation

THREADS = "threads"

# TensorFlow reads these when it starts: they set the pool size for a run
# without tfdet (with tfdet, `Change.threads` reaches enable()).
_THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def other_pool_size(threads: int | None) -> int:
    """The pool size the other runs of a `threads` perturbation get.

    3 against a baseline of 1 or 2 (pools of 1 and 2 can give the same bits,
    where 3 gives other ones), 1 against any larger baseline (None: the
    CPUs this process may use, the default's pool).
    """
    return 3 if threads_here(threads) < 3 else 1


def _change(index: int, context: Context) -> Change:
    if index == 0:
        return Change(
            f"the profile's pool size ({context.threads} under enable(); "
            "without tfdet, TensorFlow's default)",
            env=dict.fromkeys(_THREAD_VARIABLES),
        )
    pool = other_pool_size(context.threads)
    return Change(
        f"pool size {pool} instead of the profile's: not another machine, a "
        "different setting; bits may follow it",
        env=dict.fromkeys(_THREAD_VARIABLES, str(pool)),
        threads=pool,
    )


PERTURBATION = Perturbation(
    name=THREADS,
    description="another thread-pool size (not in 'all': a different "
    "setting, not another machine; shows whether the bits follow the "
    "pool size)",
    imitates="Another thread-pool size (opt-in): a different setting "
    "on the same CPU, not another machine.",
    # Another core count (`affinity`, in the default set) already gives
    # the default profile another pool; this one chooses the size, for a
    # profile whose bits follow it too (`--patches` without
    # pool_size_free_products, or without tfdet), where it fails by design.
    default=False,
    other_machine=False,
    change=_change,
)
