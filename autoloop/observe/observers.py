"""What follows each ledger append besides the loop's own work: git notes and trackers.

The loop calls :meth:`Observers.recorded` right after a record is appended, and
:meth:`Observers.catch_up` once at start (after recovery), which brings notes and trackers
up to date with everything the ledger holds, attempts recorded by ``--resume`` or by a run
that was killed before its observers saw them included. Neither can stop the loop: a
failure is one warning line, and the next start catches up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from autoloop.observe.console import Console
from autoloop.observe.git_notes import Notes, NotesError
from autoloop.observe.trackers import TrackerError, Tracking, open_tracker
from autoloop.store.ledger import LedgerRecord


class Records(Protocol):
    """Where the records come from: the night's arbiter (its records in memory, no re-read of
    the ledger per append) or a Ledger."""

    def records(self) -> list[LedgerRecord]: ...


class Observers:
    def __init__(self, ledger: Records, console: Console, notes: Notes | None = None,
                 tracking: Tracking | None = None):
        self.ledger, self.console, self.notes, self.tracking = ledger, console, notes, tracking

    def recorded(self, record: LedgerRecord) -> None:
        if self.notes is not None and record.commit:
            try:
                self.notes.record(self.ledger.records(), record)
            except (NotesError, OSError) as e:
                self.console.line(f"warning: git note of trial {record.trial}.{record.attempt} not written "
                                  f"({e}); the next start writes it")
        if self.tracking is not None:
            self.tracking.recorded(record)

    def catch_up(self) -> None:
        records = self.ledger.records()
        if self.notes is not None:
            try:
                written = self.notes.catch_up(records)
            except (NotesError, OSError) as e:
                self.console.line(f"warning: git notes not brought up to date ({e})")
            else:
                if written:
                    self.console.line(f"notes: wrote {written} git note(s) the ledger had ahead of "
                                      "refs/notes/autoloop")
        if self.tracking is not None:
            queued = self.tracking.catch_up(records)
            if queued:
                names = ", ".join(t.name for t in self.tracking.trackers)
                self.console.line(f"track: {queued} recorded attempt(s) not yet in {names}; logging them")

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.close()


def open_observers(root: Path, results_dir: Path, tag: str, ledger: Records, console: Console,
                   track: list[str], target: str, run_settings: dict[str, Any]) -> Observers:
    """Notes always; the trackers named in ``track``. A tracker that is not installed is a
    setup mistake (TrackerError, before anything runs); one that fails to start (a store it
    cannot open) is a warning line, and the night goes on without it: its done-file then
    lacks these attempts, so the next start logs them."""
    trackers = []
    for name in track:
        try:
            trackers.append(open_tracker(name, results_dir, tag))
        except TrackerError:
            raise
        except Exception as e:  # a tracker never stops the loop: one warning line
            said = " ".join(str(e).split())[:300]
            console.line(f"warning: --track {name}: cannot start ({type(e).__name__}: {said}); "
                         "the night goes on without it, and the next start logs what it missed")
    tracking = None
    if trackers:
        tracking = Tracking(trackers, root, results_dir, tag, target, run_settings,
                            warn=lambda text: console.line(f"warning: {text}"))
        console.line(f"track: each attempt goes to {', '.join(t.name for t in trackers)} "
                     f"(group autoloop/{tag})")
    return Observers(ledger, console, Notes(root), tracking)
