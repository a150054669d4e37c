"""The code that runs inside a child process (`python -m tfdet._child`).

`_start` is the child's side of the protocol (start, progress, result); the
kinds of child are `_worker` (a `tfdet check` TARGET run), `_locate_worker`,
`_script_worker` and `_preflight`. Nothing here imports the commands or the
runner (`tests/test_package.py` holds the layer table).
"""
