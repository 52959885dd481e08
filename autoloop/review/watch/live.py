"""The loop of `autoloop watch`: a frame every ``interval`` seconds on the terminal's
alternate screen until ``q``, Ctrl-C, SIGTERM or SIGHUP; ``--once`` prints one frame.

It reads what the dashboard reads and nothing else: no lock is taken and nothing is
written under results/, so it can come and go while a night runs.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoloop.core.errors import AutoloopError
from autoloop.review.dashboard.views import WorkspaceViews
from autoloop.review.watch.terminal import Ended, cbreak, signals_end_watch

INSTALL_HINT = "watch needs rich: pip install 'autoloop[watch]'"
QUIT_KEYS = {"q", "Q"}
TERMINAL_GONE = {errno.EIO, errno.ENXIO, errno.EBADF}

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


class WatchError(AutoloopError):
    """rich is missing, or there is no terminal to draw on."""


def watch(root: Path, interval: float = 2.0, last: int = 10, once: bool = False) -> int:
    """Draw the night of the repository at ``root``; the exit status."""
    try:
        from rich.console import Console
        from rich.live import Live

        from autoloop.review.watch.frame import frame
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "rich":
            raise WatchError(INSTALL_HINT) from None
        raise
    views = WorkspaceViews(root)
    console = Console(highlight=False)
    if once:
        console.print(frame(views, last, console.width))
        return 0
    if not console.is_terminal:
        raise WatchError("watch: stdout is not a terminal (--once prints one frame)")
    try:
        with signals_end_watch(), cbreak() as keys, \
                Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False) as live:
            while True:
                live.update(_safe_frame(frame, views, last, console), refresh=True)
                typed = keys.wait(interval)
                if typed == "" or (typed and QUIT_KEYS & set(typed)):
                    return 0
    except Ended as e:
        return 128 + e.signum
    except OSError as e:
        if e.errno in TERMINAL_GONE:   # a hang-up (SSH dropped): nothing left to draw on or restore
            return 128 + signal.SIGHUP
        raise


def _safe_frame(frame: Callable[..., RenderableType], views: WorkspaceViews, last: int,
                console: Console) -> RenderableType:
    """A frame, or the one-line reason there is none this time (a ledger line being
    written, a state file replaced): the next refresh tries again."""
    from rich.text import Text

    try:
        return frame(views, last, console.width, console.height)
    except (AutoloopError, OSError, ValueError) as e:
        return Text(f"autoloop watch: cannot read the night now ({e}); trying again", style="yellow")
