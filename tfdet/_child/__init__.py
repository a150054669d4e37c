"""The code that runs inside a child process (`python -m tfdet._child`).

`_start` is the child's side of the protocol (start, progress, result); the
kinds of child are `_worker` (a `tfdet check` TARGET run), `_locate_worker`,
`_script_worker` (a `check --script` run: its hooks in `_script_hooks`,
what they record in `_script_recorder`), `_preflight` and `_cost_worker`
(`tfdet cost`'s setting, with `_cost_script` for a whole script and `_ops`
for the profiler's per-op times). A script's run, checked or timed, keeps
its own copy of training state outside its directory (`_own_copies`) and
reads Keras's training calls alike (`_keras_calls`). Nothing here imports
the commands or the
runner (`tests/test_package.py` holds the layer table).
"""
