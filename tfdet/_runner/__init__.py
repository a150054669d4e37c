"""The parent's process runner: starts the child processes a command planned,
follows their progress, kills what overruns, and reads back each one's
result and trace (`_spawn`); mirrors a script's directory for each run
(`_workdir`); talks to a run that answers requests while it runs
(`_conversation`, `tfdet cost`'s).
"""
