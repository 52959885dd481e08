"""`autoloop note`: a note from the person to every later prompt, or --clear, or the notes in force."""

from __future__ import annotations

import argparse
import time

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    from autoloop.core.layout import Layout
    from autoloop.store.person_notes import PersonNotesError, active_notes, add_note, clear_notes

    root = repo_root(args.directory)
    if not (root / ".git").exists():
        raise PersonNotesError(f"{root} is not a git repository: run autoloop note in the experiment repository "
                               "(or give it with -C DIR)")
    if (args.clear or args.unpin) and args.text:
        raise PersonNotesError(f"give a note or {'--unpin' if args.unpin else '--clear'}, not both")
    if args.pin and not args.text:
        raise PersonNotesError('--pin needs the lesson, e.g. autoloop note --pin "LR above 0.08 diverges"')
    results = Layout.of(root).root
    if args.clear or args.unpin:
        n = clear_notes(results, pinned=args.unpin)
        what = "pinned lesson" if args.unpin else "note"
        print(f"cleared {n} {what}{'s' if n != 1 else ''}" if n else f"no {what}s to clear")
        return 0
    if args.text:
        note = add_note(results, " ".join(args.text), pinned=args.pin)
        if args.pin:
            print(f"pinned at {_hhmm(note.at)}: every later prompt of every later night carries it "
                  "(autoloop note --unpin drops it)")
        else:
            print(f"noted at {_hhmm(note.at)}: every later prompt carries it (autoloop note --clear drops it)")
        return 0
    notes = active_notes(results)
    for note in notes:
        print(f"{_hhmm(note.at)}  {'[pinned] ' if note.pinned else ''}{note.text}")
    if not notes:
        print('no notes in force (add one: autoloop note "try SwiGLU; leave the LRs alone")')
    return 0


def _hhmm(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
