"""The code that runs inside a child process (`python -m tfdet._child`).

`_start` is the child's side of the protocol (start, progress, result); the
kinds of child are `_worker` (a `tfdet check` TARGET run), `_locate_worker`,
`_script_worker`, `_preflight` and `_cost_worker` (`tfdet cost`'s setting,
with `_cost_script` for a whole script and `_ops` for the profiler's per-op
times). Nothing here imports the commands or the
runner (`tests/test_package.py` holds the layer table).
"""
