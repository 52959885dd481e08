"""A worker slot: where a worker's attempts run (a work tree, a state file, an executor, a device).

Its own module, below what runs in one (``candidate.py`` prepares a candidate in a slot,
``attempt.py`` runs it there), so that neither has to import the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoloop.engine.night import Night
from autoloop.execution.executors import Executor
from autoloop.observe.console import Console, Prefixed
from autoloop.repo.workspace import Workspace
from autoloop.store.state import StateFile


@dataclass
class Slot:
    """One worker slot: where its attempts run. The single loop is one slot on the main
    checkout (worker None); N parallel workers are N slots, each on a worktree of its own."""

    ws: Workspace
    state: StateFile
    worker: int | None
    executor: Executor
    env: dict[str, str] = field(default_factory=dict)   # added to its trials' environment (device, threads)
    console: Console | Prefixed | None = None

    @classmethod
    def main(cls, night: Night, state: StateFile | None = None) -> Slot:
        """The main checkout's slot (worker None, the night's executor and console): the single
        loop's, the baseline's, `autoloop trial`'s, verify's and the ladder's. ``state``: its
        state file (default: state.json as it is on disk)."""
        return cls(night.ws, state or StateFile(night.layout.root), None, night.executor, {}, night.console)
