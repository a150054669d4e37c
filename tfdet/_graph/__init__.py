"""Analysing training graphs: the scan of a traced training step for GPU
hazards (`_scan`) and the Keras layer tree its findings are named by
(`_layers`). The hazard table and the patch registry it reads live in
`tfdet.patches` (`_hazards`, `_registry`).
"""
