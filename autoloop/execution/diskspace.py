"""Free disk space: the loop stops before a trial when a filesystem it writes to runs low.

A night fills disks in ways nobody watches: logs, checkpoints a trial leaves in the
workspace, result files, git objects. A trial that starts on a nearly full disk dies in
ways that look like its own fault (a truncated checkpoint, a failed write in a library),
and so do the ledger and git. Stopping with a clear reason is cheaper than diagnosing that.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _existing(path: Path) -> Path:
    """The path itself, else its nearest existing parent (a data dir not prepared yet)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def low_disk_reason(paths: list[Path | None], min_free_gb: float) -> str | None:
    """None when every filesystem holding one of paths has at least min_free_gb GiB free
    (0 turns the check off), else the stop reason naming the first one that does not."""
    if not min_free_gb:
        return None
    seen: set[int] = set()
    for path in paths:
        if path is None:
            continue
        where = _existing(Path(path))
        try:
            device = where.stat().st_dev
            free = shutil.disk_usage(where).free
        except OSError:  # vanished or unreadable: nothing to measure, the writes will say more
            continue
        if device in seen:
            continue
        seen.add(device)
        if free < min_free_gb * 2**30:
            return f"low disk: {free / 2**30:.1f} GB free on {where} (--min-free-gb {min_free_gb:g})"
    return None
