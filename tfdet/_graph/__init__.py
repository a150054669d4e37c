"""Analysing training graphs: the GPU hazard table, the scan of a traced
training step, the Keras layer tree, and the registry of deterministic patches
(the patch modules themselves live in `tfdet.patches`).
"""
