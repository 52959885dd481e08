"""Writing a file so that a reader, or the next start after a crash, sees all of it or none.

``atomic_write`` writes a temporary file in the same folder, flushes and fsyncs it, then
``os.replace``s it over the target and fsyncs the folder: readers (``autoloop status``
from another shell, a recovery after ``kill -9`` or a power loss) see the old file or the
new one, never half of one. ``evaluate.py`` keeps its own copy of this: trials import it,
and it stays free of the harness's other modules.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

_write_faults: dict[str, int] = {}


def fault_write(path: Path) -> None:
    """Fault injection for benchmarks/chaos.py and its test (off unless set):
    AUTOLOOP_FAULT_WRITE=<ENOSPC|EIO>:<file name>[:<n>] makes the n-th write (default 1st)
    of that file in this process fail with that error, as a full or failing disk would."""
    wanted = os.environ.get("AUTOLOOP_FAULT_WRITE")
    if not wanted:
        return
    code, _, rest = wanted.partition(":")
    name, _, nth = rest.partition(":")
    if Path(path).name != name or code not in ("ENOSPC", "EIO"):
        return
    _write_faults[name] = _write_faults.get(name, 0) + 1
    if _write_faults[name] == int(nth or 1):
        number = getattr(errno, code)
        raise OSError(number, os.strerror(number), str(path))


def atomic_write(path: Path, data: bytes | str, *, fsync: bool = True, sync_dir: bool = True,
                 mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` all at once. ``fsync=False`` (tests, benchmarks) skips
    the syncs: a power loss may then lose the write, never tear it. ``sync_dir=False`` syncs
    the data but not the rename, for a file rewritten many times a minute whose older
    version is as good after a power loss (the state file: the ledger is the truth)."""
    path = Path(path)
    fault_write(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)   # mkstemp makes 0600; these files are for people (and tools) to read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a create or rename in it survives power loss (POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass   # some platforms and filesystems refuse fsync on directories
    finally:
        os.close(fd)
