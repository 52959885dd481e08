"""A disk that refused a write (full, over quota, read-only, failing): the machine's trouble,
not a bug of ours, so one line saying so instead of an internal error's bug-report request.

What was recorded before the failed write is safe: the ledger is appended a whole line at a
time and a torn last line is repaired at the next start (store/ledger.py), and results.tsv is
regenerated from the ledger; benchmarks/chaos.py injects these errors into ledger and
results.tsv writes and counts nothing lost.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from autoloop.cli.paths import shown_path

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}


def disk_error_line(error: BaseException) -> str | None:
    """The line for an OSError of the disk, else None (the caller treats it as a bug)."""
    if not isinstance(error, OSError) or error.errno not in DISK_ERRNOS:
        return None
    where = f" {shown_path(Path(os.fsdecode(error.filename)), Path.cwd())}" if error.filename else ""
    what = error.strerror or os.strerror(error.errno or 0)
    return (f"autoloop: the disk refused a write{where}: {what}; what was recorded is safe: fix the disk "
            "(free space, a quota, a read-only mount), then autoloop run --resume")
