"""What tfdet's parent process and its children agree on: the worker spec
and the kinds of child (`_spec`), the perturbations that imitate another
machine (`_perturb`, with the emulated CPU in `_emulation`), and the
`batch` perturbation's predictions (`_predict`).
"""
