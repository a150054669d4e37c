"""Pinning the process: everything that decides the bits before training starts.

`enable()` and the frozen `Profile` it returns, the environment fingerprint,
the oneDNN instruction-set cap, the library versions and the visible devices.
"""
