"""The commands that check and locate: what `tfdet check`, `check --script`,
`locate` and the Python API (`tfdet.check`, `tfdet.locate`) do, from their
options (`_options`) to their typed reports (`_report`).

They plan the runs, hand them to the runner (`tfdet._runner`) and compare
what comes back (`tfdet._record`); they never run inside a child.
"""
