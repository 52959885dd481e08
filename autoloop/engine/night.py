"""The night: the collaborators the engine is built from, as ``opening.open_night`` made
them, and the stop request every attempt watches.

It is its own module, below everything that takes a night (recovery among them), because
``opening.py`` calls recovery while it opens one: the type lives apart from the procedure.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from autoloop.config.settings import Settings
from autoloop.core.layout import Layout
from autoloop.engine.arbiter import Arbiter
from autoloop.engine.study import Memory
from autoloop.execution.diskspace import low_disk_reason
from autoloop.execution.executors import Executor
from autoloop.execution.integrity import InputsSnapshot
from autoloop.observe.console import Console
from autoloop.repo.workspace import Workspace
from autoloop.store.ledger import Ledger


@dataclass
class Stop:
    """The night's stop request: set by SIGINT/SIGTERM (``signal`` names it) or by a fatal
    error; every running attempt ends at once and is recorded."""

    event: threading.Event = field(default_factory=threading.Event)
    signal: str | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def exit_status(self) -> int:
        """The shell's convention for a run a signal stopped: 128 + its number (130 for
        SIGINT, 143 for SIGTERM), so that a script or a scheduler sees it was stopped;
        0 for every other stop (--hours, --max-trials, no more ideas)."""
        return 128 + signal.Signals[self.signal].value if self.signal else 0


@dataclass
class Night:
    """The collaborators of one night, as open_night made them."""

    settings: Settings
    console: Console
    ws: Workspace            # the main checkout: the loop's branch, always at the best
    layout: Layout
    ledger: Ledger
    arbiter: Arbiter
    tag: str
    stop: Stop
    executor: Executor
    data_dir: Path | None = None
    fingerprint: str | None = None
    inputs: InputsSnapshot | None = None
    memory: Memory = field(default_factory=Memory)   # the study's earlier comparable nights (study.py)

    def low_disk(self) -> str | None:
        """The stop reason when a disk the night writes to is under --min-free-gb."""
        return low_disk_reason([self.layout.root, self.ws.root, self.data_dir], self.settings.min_free_gb)
