"""The machinery the patches stand on, apart from the patches themselves.

`_registry` finds the patch modules (`tfdet.patches`) and installs the ones
the profile asks for; `_hazards` reads the hazard table (`hazards.json`:
which ops TensorFlow refuses or runs with bits that follow the machine);
`_swap` and `_import_hook` make each replacement reversible and wait for
the module it patches; `_exact_math` holds what the exact-math patches
share: TensorFlow's generated ops as a patch calls them, and the inputs a
patch left to them.
"""
