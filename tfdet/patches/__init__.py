"""Deterministic replacements, one module per patched op.

Each public module declares one `PATCH` (a `tfdet._patching._registry.Patch`,
named like the module): the op types it replaces, the upstream issue it
answers, and how it makes its replacements. `tfdet._patching._registry` finds the
modules here on first use; importing this package installs nothing and
imports no patch. Each replacement is built only from ops that are
deterministic on GPU and stay on the device. Modules whose names start with
`_` are helpers.
"""
