"""The tfdet version, in a module of its own so that any module can say it."""

__version__ = "0.1.0"
