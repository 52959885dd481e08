"""Proposers: where the next change to the target comes from."""

from __future__ import annotations

from pathlib import Path

from autoloop.proposers.base import Proposer


class ProposerError(Exception):
    """No usable proposer for these settings; the message is one line for the user."""


def make_proposer(settings, workspace_root: Path) -> tuple[Proposer, str]:
    """The proposer the settings ask for, and one line saying which was chosen and why."""
    from autoloop.proposers.queue import QueueProposer

    queue_dir = Path(workspace_root) / settings.queue_dir
    if settings.proposer == "queue":
        return QueueProposer(queue_dir), f"proposer: queue of patches in {settings.queue_dir}/"
    if settings.proposer == "auto":
        queue = QueueProposer(queue_dir)
        if queue.pending():
            return queue, f"proposer: queue ({len(queue.pending())} patches waiting in {settings.queue_dir}/)"
        raise ProposerError(f"no proposer available: put patches in {settings.queue_dir}/ or choose --proposer")
    raise ProposerError(f"proposer '{settings.proposer}' is not available in this version")
