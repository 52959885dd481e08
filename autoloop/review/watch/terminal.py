"""Single key presses from the terminal, for `autoloop watch`'s ``q``.

stdin is put in cbreak mode (no line buffering, no echo; Ctrl-C still sends SIGINT) and
its settings are put back on every way out: a return, an exception, Ctrl-C, and SIGTERM
or SIGHUP, which :func:`signals_end_watch` turns into an exception so that the ``finally``
blocks run (a terminal that hung up has nothing left to restore, and that is no error).
When stdin is not a terminal nothing is changed and no key is read.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO


class Ended(BaseException):
    """SIGTERM or SIGHUP while watching; ``signum`` is which. Like KeyboardInterrupt it is
    no error (no ``except Exception`` takes it): it only unwinds to the terminal's restore."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class Keys:
    """Keys typed on a terminal in cbreak mode (``fd``), or none when ``fd`` is None."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def wait(self, timeout: float) -> str | None:
        """What was typed within ``timeout`` seconds (None: nothing); "" when the terminal
        is gone (a hang-up reads as the end of the file)."""
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        return os.read(self.fd, 64).decode("utf-8", errors="replace")


@contextmanager
def cbreak(stream: IO[str] | None = None) -> Iterator[Keys]:
    """``stream`` (stdin by default) in cbreak mode for the block, restored afterwards."""
    stream = sys.stdin if stream is None else stream
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):   # closed, or not a file (a test's StringIO)
        fd = -1
    if fd < 0 or not os.isatty(fd):
        yield Keys(None)
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield Keys(fd)
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except termios.error:   # the terminal hung up: there is nothing left to restore
            pass


@contextmanager
def signals_end_watch() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Ended` in the main thread for the block."""

    def end(signum: int, _frame: FrameType | None) -> None:
        raise Ended(signum)

    previous = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
