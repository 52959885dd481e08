"""What the loop says while it runs: plain lines, plus one live line on a terminal.

Without a terminal (redirected to a file, nohup, tmux logging) only whole lines are
written, never control characters, so the log reads cleanly in the morning. Text that
comes from elsewhere (a description an agent wrote, a reason taken from a trial's log)
may carry its own carriage returns or escape sequences: :func:`plain` strips them before
anything is written, on a terminal too.

What the lines *say* is decided in ``report.py`` (``format_verdict``, ``live_line``):
pure functions, tested without a terminal.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
from typing import TextIO

# ANSI/VT escape sequences (CSI ..., OSC ... BEL/ST, two-character ESC x), then any other
# C0/C1 control character. Tabs and line breaks become spaces: a line is one line.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Characters that a non-UTF-8 log (LANG=C under an old Python, a latin-1 terminal)
# cannot hold, with ASCII stand-ins.
_ASCII_STAND_INS = {"σ": "sd", "→": "->", "…": "...", "—": "-", "Δ": "d"}

CLEAR_LINE = "\r\x1b[2K"   # only ever written when live (a terminal)


def plain(text: str) -> str:
    """``text`` as one printable line: escape sequences removed, control characters
    (\\r, \\n, \\t, backspace, ...) replaced by spaces, no trailing blanks."""
    return _CONTROLS.sub(" ", _ESCAPES.sub("", text)).rstrip()


DISPLAY_REASON = 240   # a reason on the terminal (the ledger keeps up to ~500 characters)


def shorten(text: str, limit: int = DISPLAY_REASON) -> str:
    """``text`` cut to ``limit`` characters for display, its middle dropped: the start says
    what happened, the end usually where to look ("(see results/agents/3-1.log)")."""
    if len(text) <= limit:
        return text
    tail = min(60, limit // 3)
    return text[:limit - tail - 3].rstrip() + " … " + text[-tail:].lstrip()


def _encodable(text: str, encoding: str | None) -> str:
    if not encoding:
        return text
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        for char, stand_in in _ASCII_STAND_INS.items():
            text = text.replace(char, stand_in)
        return text.encode(encoding, errors="replace").decode(encoding, errors="replace")


class Console:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stdout
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError):   # a closed or file-like stream without isatty
                live = False
        self.live = live
        self._lock = threading.Lock()
        self._live_shown = False

    def _text(self, text: str) -> str:
        return _encodable(plain(text), getattr(self.stream, "encoding", None))

    def line(self, text: str) -> None:
        """A permanent line (clears the live line first on a terminal)."""
        text = self._text(text)
        with self._lock:
            if self._live_shown:
                self.stream.write(CLEAR_LINE)
                self._live_shown = False
            self.stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """The live line: redrawn in place on a terminal, dropped otherwise."""
        if not self.live:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        text = self._text(text)
        with self._lock:
            self.stream.write(CLEAR_LINE + text[:width])
            self.stream.flush()
            self._live_shown = True

    def error(self, text: str) -> None:
        self.line(text)
