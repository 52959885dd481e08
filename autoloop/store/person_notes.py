"""Notes from the person running the night: ``autoloop note "try SwiGLU"`` from any shell.

Not to be confused with ``notes.py``, which writes *git notes* on trial commits: these are
the person's words to the agent. Every later prompt carries the notes in force (in the
research digest, digest.py) until ``autoloop note --clear``; the report lists them all,
cleared ones included, with their times.

One file, ``results/person-notes.json``: ``{"events": [{"at": t, "note": text} |
{"at": t, "clear": true}, ...]}``, never edited in place. A writer (``autoloop note``,
from another shell while the loop runs) holds ``results/.person-notes.lock`` (filelock)
while it reads the events, adds one and writes the whole file anew with
:func:`autoloop.store.atomic.atomic_write` (temp file, fsync, rename): two writers never lose
each other's note, and the loop, which reads without the lock, sees the old file or the
new one, never half of one. Notes stay across tags (a new tag archives the ledger, not
the person's instructions) until cleared. A *pinned* note (``autoloop note --pin``) is a
lesson of the study for every later night: ``--clear`` keeps it, ``--unpin`` drops the
pinned ones (``{"at": t, "note": text, "pinned": true}``, ``{"at": t, "clear": true,
"pinned": true}``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout
from autoloop.store.atomic import atomic_write
from autoloop.store.digest import Note

MAX_NOTE = 1000          # characters of one note (the digest shows up to digest.NOTE_WIDTH)
LOCK_TIMEOUT_S = 10.0


class PersonNotesError(AutoloopError):
    """A note that cannot be written or a notes file that cannot be read (one line)."""


def notes_path(results_dir: Path) -> Path:
    return Layout(Path(results_dir)).person_notes


def add_note(results_dir: Path, text: str, now: float | None = None, pinned: bool = False) -> Note:
    """Record one note (its spacing and line breaks collapsed to one line); ``pinned``: a
    lesson for every later night, which ``--clear`` keeps (``--unpin`` drops it)."""
    line = " ".join(str(text).split())
    if not line:
        raise PersonNotesError('an empty note: give the text, e.g. autoloop note "try SwiGLU"')
    if len(line) > MAX_NOTE:
        raise PersonNotesError(f"a note is at most {MAX_NOTE} characters (this one has {len(line)}): "
                               "say it shorter, or in several notes")
    note = Note(time.time() if now is None else now, line, pinned)
    _append(results_dir, {"at": note.at, "note": note.text, **({"pinned": True} if pinned else {})})
    return note


def clear_notes(results_dir: Path, now: float | None = None, pinned: bool = False) -> int:
    """Clear the notes in force (they stay in the history for the report); how many there were.
    The pinned lessons stay unless ``pinned`` (``autoloop note --unpin``), which clears those alone."""
    if not notes_path(results_dir).exists():
        return 0
    cleared = len([n for n in active_notes(results_dir) if n.pinned == pinned])
    if cleared:
        _append(results_dir, {"at": time.time() if now is None else now, "clear": True,
                              **({"pinned": True} if pinned else {})})
    return cleared


def active_notes(results_dir: Path) -> list[Note]:
    """The notes in force, oldest first: the pinned lessons since the last --unpin, and the
    other notes since the last --clear."""
    notes: list[Note] = []
    for event in history(results_dir):
        if event.get("clear"):
            pinned = event.get("pinned") is True
            notes = [n for n in notes if n.pinned != pinned]
        else:
            notes.append(Note(event["at"], event["note"], event.get("pinned") is True))
    return notes


def history(results_dir: Path) -> list[dict[str, Any]]:
    """Every note and clear, in order; [] when there has been none."""
    path = notes_path(results_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise PersonNotesError(f"cannot read {path} ({e}); fix or remove it") from None
    events = data.get("events") if isinstance(data, dict) else None
    if not isinstance(events, list) or not all(_valid(e) for e in events):
        raise PersonNotesError(f"{path} is not a notes file written by autoloop note; fix or remove it")
    return events


def _valid(event: object) -> bool:
    return (isinstance(event, dict) and isinstance(event.get("at"), (int, float))
            and (event.get("clear") is True or isinstance(event.get("note"), str)))


def _append(results_dir: Path, event: dict[str, Any]) -> None:
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(Layout(results_dir).person_notes_lock), timeout=LOCK_TIMEOUT_S):
            events = history(results_dir) + [event]
            atomic_write(notes_path(results_dir), json.dumps({"events": events}, ensure_ascii=False, indent=1) + "\n")
    except Timeout:
        raise PersonNotesError(f"another autoloop note has held {Layout(results_dir).person_notes_lock} for "
                               f"{LOCK_TIMEOUT_S:.0f}s; try again") from None
