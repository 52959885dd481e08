"""The one base class of every error a user may see.

Each module raises its own subclass (``ConfigError``, ``WorkspaceError``, ...) with a
message that is one line for the user, naming what is wrong and what to do. ``cli.main``
catches :class:`AutoloopError` alone and prints ``autoloop: <message>``; anything else
is a bug of ours and is reported as an internal error. So a new error class needs no
change in the CLI, and no error is ever re-wrapped as another (``raise X(str(e))``): it
travels as it was raised.
"""

from __future__ import annotations


class AutoloopError(Exception):
    """A problem the user can act on; the message is one line."""

    exit_status = 1   # the command's exit status; a subclass may name its own (the Ray head gone: 75)


class ConfigError(AutoloopError):
    """A bad setting, naming where it came from: ``--budget: ...``, ``autoloop.toml: budget: ...``."""


class NightError(AutoloopError):
    """The night cannot start or go on (lock held, interrupted run, failed baseline, ...)."""
