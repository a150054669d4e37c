"""The TARGET: a `module:function` or `file.py:function` that builds a
compiled Keras model (and its data), or a built-in model (`_builtins`);
parsed, loaded, built and fed by `_load`.
"""
