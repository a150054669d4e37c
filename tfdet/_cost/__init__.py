"""`tfdet cost`: what determinism costs on a model, on this machine.

One fresh process per setting (plain TensorFlow, and each tfdet setting that
applies here) builds the same TARGET, each started by the runner as a child
of the `cost` kind (`tfdet._child._cost_worker`); the parent has them train
in turns, block by block (`_measure`, over each run's `Conversation`), so
that a shared machine's load falls on every setting alike; each process
also profiles a few steps per op type (`tfdet._child._ops`). `_timed_settings`
says what is measured and what each profile ties the bits to; `_advice`
what to use; `_cost_report` is the typed result every reader formats.
"""
