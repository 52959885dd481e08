"""Git through GitPython: branch, clean-tree checks, commit, reset, scope guard, trial refs.

INTERFACE STUB - to be implemented (issue 4).
"""

from __future__ import annotations


class WorkspaceError(Exception):
    """The repository is not usable as a workspace; the message is one line for the user."""
