"""The commands that check and locate: what `tfdet check`, `check --script`,
`locate` and the Python API (`tfdet.check`) do, from their
options (`_options`) to their typed reports (`_report`).

They plan the runs, hand them to the runner (`tfdet._runner`), have what
comes back compared (`tfdet._record`) and report it; they never run inside
a child.
"""
