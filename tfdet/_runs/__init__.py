"""Running perturbed processes: TARGETs and the built-in models, the
perturbations that imitate another machine, the worker that trains in a fresh
process, and the `check` and `locate` drivers that spawn and compare them.
"""
