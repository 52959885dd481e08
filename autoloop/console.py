"""What the loop says while it runs: plain lines, plus one live line on a terminal.

Without a terminal (redirected to a file, nohup, tmux logging) only whole lines are
written, never control characters, so the log reads cleanly in the morning.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO


class Console:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._live_shown = False

    def line(self, text: str) -> None:
        """A permanent line (clears the live line first on a terminal)."""
        with self._lock:
            if self._live_shown:
                self.stream.write("\r\x1b[2K")
                self._live_shown = False
            self.stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """The live line: redrawn in place on a terminal, dropped otherwise."""
        if not self.live:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        with self._lock:
            self.stream.write("\r\x1b[2K" + text[:width])
            self.stream.flush()
            self._live_shown = True

    def error(self, text: str) -> None:
        self.line(text)
