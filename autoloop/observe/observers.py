"""What follows each ledger append besides the loop's own work: git notes, trackers and the
night's events (--notify, --on hooks).

The loop calls :meth:`Observers.recorded` right after a record is appended, and
:meth:`Observers.catch_up` once at start (after recovery), which brings notes and trackers
up to date with everything the ledger holds, attempts recorded by ``--resume`` or by a run
that was killed before its observers saw them included. Neither can stop the loop: a
failure is one warning line, and the next start catches up. Events are told as they happen
and never caught up: a new best from last night is no news this morning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from autoloop.core.night_events import NightEvent
from autoloop.observe.console import Console
from autoloop.observe.event_watch import EventWatch, ending_events
from autoloop.observe.git_notes import Notes, NotesError
from autoloop.observe.hooks import Hooks
from autoloop.observe.notify import Notifier
from autoloop.observe.trackers import TrackerError, Tracking, open_tracker
from autoloop.store.ledger import LedgerRecord


class Records(Protocol):
    """Where the records come from: the night's arbiter (its records in memory, no re-read of
    the ledger per append) or a Ledger."""

    def records(self) -> list[LedgerRecord]: ...


class Telling:
    """The night's events, from the records as they are appended, to --notify and --on."""

    def __init__(self, tag: str, records: list[LedgerRecord], notifier: Notifier | None, hooks: Hooks | None):
        self.tag, self.notifier, self.hooks = tag, notifier, hooks
        self.watch = EventWatch(tag, records)
        self.told: list[NightEvent] = []

    def recorded(self, record: LedgerRecord) -> None:
        for event in self.watch.recorded(record):
            self.tell(event)

    def tell(self, event: NightEvent) -> None:
        self.told.append(event)
        if self.notifier is not None:
            self.notifier.send(event)
        if self.hooks is not None:
            self.hooks.send(event)

    def ended(self, reason: str | None, error: BaseException | None, records: list[LedgerRecord]) -> None:
        for event in ending_events(self.tag, reason, error, records):
            self.tell(event)

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()
        if self.hooks is not None:
            self.hooks.close()


class Observers:
    def __init__(self, ledger: Records, console: Console, notes: Notes | None = None,
                 tracking: Tracking | None = None, telling: Telling | None = None):
        self.ledger, self.console, self.notes, self.tracking = ledger, console, notes, tracking
        self.telling = telling

    def recorded(self, record: LedgerRecord) -> None:
        if self.telling is not None:
            try:
                self.telling.recorded(record)
            except Exception as e:  # telling never stops the loop
                self.console.line(f"warning: events of #{record.trial}.{record.attempt} not told ({e})")
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

    def ended(self, reason: str | None, error: BaseException | None) -> None:
        """The night stopped (``reason`` as state.json has it; ``error`` when one ended it)."""
        if self.telling is not None:
            try:
                self.telling.ended(reason, error, self.ledger.records())
            except Exception as e:  # telling never stops the loop
                self.console.line(f"warning: the night's end not told ({e})")

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.close()
        if self.telling is not None:
            self.telling.close()


def open_observers(root: Path, results_dir: Path, tag: str, ledger: Records, console: Console,
                   track: list[str], target: str, run_settings: dict[str, Any],
                   telling: Telling | None = None) -> Observers:
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
    return Observers(ledger, console, Notes(root), tracking, telling)


def open_telling(root: Path, results_dir: Path, tag: str, ledger: Records, console: Console,
                 notify: list[str], notify_every: float, hooks: dict[str, str],
                 hook_timeout: float) -> Telling | None:
    """None without --notify and --on; a NotifyError (apprise missing, a bad URL, an unset
    ${VAR}) before anything runs."""
    if not notify and not hooks:
        return None
    warn = lambda text: console.line(f"warning: {text}")   # noqa: E731
    notifier = Notifier(notify, notify_every, warn) if notify else None
    runner = Hooks(hooks, root, results_dir, hook_timeout, warn) if hooks else None
    said = ([f"{len(notify)} notification URL(s)"] if notify else []) + (
        [f"hooks on {', '.join(hooks)}"] if hooks else [])
    console.line(f"events: {' and '.join(said)}")
    return Telling(tag, ledger.records(), notifier, runner)
