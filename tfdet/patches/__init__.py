"""Deterministic replacements, one module per patched op.

Importing this package registers every patch with `tfdet._patching`; it
installs nothing. `tfdet.enable()` installs the ones the running versions need.
"""
