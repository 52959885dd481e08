"""Containment: each run in a cgroup of its own, where the machine allows it.

A trial (or agent call) that calls setsid, double-forks and clears its environment leaves
the session, the token and, once its parent is gone, the tree: tracking (``procs.py``)
cannot find it. A cgroup it is placed in before it runs (between fork and exec) holds it
and everything it ever starts, whatever it does. Where this machine lets us make cgroups,
each run gets one, named after its token, under this process's own cgroup: cgroup v2 (as
root or with a delegated subtree), else cgroup v1's freezer or pids hierarchy
(:func:`containment` probes, once per process). Elsewhere tracking alone.

* :class:`RunGroup`: one run's group, joined between fork and exec, ended with the run;
* :func:`kill_group`, :func:`group_of_token`: a group left by a kill, ended by recovery;
* :func:`sweep_empty_groups`: empty groups no recovery will reach, removed at a start.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

KILL_WAIT_S = 10.0                  # after SIGKILL, how long to wait for the kernel to finish the job
GROUP_PREFIX = "autoloop-"


@dataclass(frozen=True)
class Containment:
    """Where trial groups are made: ``kind`` is cgroup2, freezer (cgroup v1) or pids (v1)."""

    kind: str
    parent: Path

    def describe(self) -> str:
        what = {"cgroup2": "cgroup v2", "freezer": "cgroup v1 freezer", "pids": "cgroup v1 pids"}[self.kind]
        return f"{what} ({self.parent}): each trial and agent call in a cgroup of its own"


def _own_cgroups() -> list[tuple[str, str]]:
    """(controllers, path) of this process's cgroups: "" for the v2 hierarchy."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    return [(parts[1], parts[2]) for parts in (line.split(":", 2) for line in lines) if len(parts) == 3]


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, filesystem type, options) of every cgroup mount."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            found.append((fields[1].replace("\\040", " "), fields[2], set(fields[3].split(","))))
    return found


def _candidates() -> list[Containment]:
    own = _own_cgroups()
    found = []
    for point, fstype, options in _mounts():
        kind: str | None
        if fstype == "cgroup2":
            path = next((p for controllers, p in own if controllers == ""), None)
            kind = "cgroup2"
        else:
            kind = next((k for k in ("freezer", "pids") if k in options), None)
            path = next((p for controllers, p in own if kind and kind in controllers.split(",")), None)
        if kind and path is not None:
            found.append(Containment(kind, Path(point) / path.lstrip("/")))
    order = {"cgroup2": 0, "freezer": 1, "pids": 2}
    return sorted(found, key=lambda c: order[c.kind])


def _probe(containment: Containment) -> str | None:
    """Make a group, move a short-lived process into it, end it, remove it: None when all of
    that works, else why not."""
    group = containment.parent / f"{GROUP_PREFIX}probe-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup in {containment.parent}: {exc.strerror or exc}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (group / "cgroup.procs").write_text(str(child.pid))
        if str(child.pid) not in (group / "cgroup.procs").read_text().split():
            return f"a process moved into {group} did not show there"
    except OSError as exc:
        return f"cannot move a process into a cgroup under {containment.parent}: {exc.strerror or exc}"
    finally:
        child.kill()
        child.wait()
        _rmdir(group)
    return None


@functools.lru_cache(maxsize=1)
def containment() -> tuple[Containment | None, str]:
    """The containment in force for this process, and a line saying which (or why none)."""
    if not sys.platform.startswith("linux"):
        return None, "process tracking (session, token, subreaper): no cgroups on this platform"
    why = "no cgroup hierarchy mounted"
    for candidate in _candidates():
        refused = _probe(candidate)
        if refused is None:
            return candidate, candidate.describe()
        why = refused
    return None, f"process tracking (session, token, subreaper): {why}"


def _rmdir(group: Path, timeout: float = 2.0) -> None:
    """Remove an emptied cgroup (the kernel says busy until its last member is reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                logger.warning("could not remove cgroup %s", group)
                return
            time.sleep(0.02)


class RunGroup:
    """The cgroup of one run: its processes join it before exec; ``end`` kills all of them."""

    def __init__(self, where: Containment, token: str):
        self.kind = where.kind
        self.path = where.parent / f"{GROUP_PREFIX}{token}"
        self.path.mkdir(exist_ok=True)
        # Opened here, written in the child between fork and exec (os.write only: no locks).
        self._procs_fd = os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        self._ended = False

    @classmethod
    def open(cls, token: str) -> RunGroup | None:
        where = containment()[0]
        if where is None:
            return None
        try:
            return cls(where, token)
        except OSError as exc:   # the machine changed since the probe: tracking still ends the tree
            logger.warning("no cgroup for this run: %s", exc)
            return None

    def join(self) -> None:
        """In the child after fork: move this process (0: the writer) into the group."""
        os.write(self._procs_fd, b"0")

    def pids(self) -> list[int]:
        return pids_in_group(self.path)

    def end(self) -> int:
        """SIGKILL everything in the group, wait until it is empty, remove it; how many there
        were. Once: a second call finds nothing."""
        if self._ended:
            return 0
        os.close(self._procs_fd)
        self._ended = True
        return kill_group(self.path, self.kind)


def pids_in_group(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_group(path: Path, kind: str | None = None) -> int:
    """End every process in the cgroup at ``path`` and remove it. Forks cannot outrun it: v2's
    cgroup.kill is atomic; v1 freezes the group (freezer) or forbids forks (pids) first."""
    members = pids_in_group(path)
    if not path.exists():
        return 0
    kind = kind or ("cgroup2" if (path / "cgroup.kill").exists() or (path / "cgroup.type").exists()
                    else "freezer" if (path / "freezer.state").exists() else "pids")
    with contextlib.suppress(OSError):
        if kind == "cgroup2" and (path / "cgroup.kill").exists():
            (path / "cgroup.kill").write_text("1")
        elif kind == "cgroup2":
            (path / "cgroup.freeze").write_text("1")
        elif kind == "freezer":
            (path / "freezer.state").write_text("FROZEN")
        else:
            (path / "pids.max").write_text("0")
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        left = pids_in_group(path)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if kind == "freezer":   # killed while frozen: they die once thawed
            with contextlib.suppress(OSError):
                (path / "freezer.state").write_text("THAWED")
        elif kind == "cgroup2" and not (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (path / "cgroup.freeze").write_text("0")
        time.sleep(0.02)
    _rmdir(path)
    return len(members)


def group_of_token(token: str) -> tuple[Path, str] | None:
    """The cgroup a run with ``token`` was given, if it is still there (recovery)."""
    where = containment()[0]
    if where is None or not token:
        return None
    path = where.parent / f"{GROUP_PREFIX}{token}"
    return (path, where.kind) if path.is_dir() else None


def sweep_empty_groups(min_age_s: float = 60.0) -> int:
    """Remove every empty ``autoloop-*`` cgroup older than ``min_age_s``; how many went.

    A run ends its own group, and ``--resume`` ends the one state.json names; what neither
    reaches stays forever (kept in the kernel, listed under the parent): the group of a run
    whose orchestrator was killed and never resumed (another tag, results/ removed), found
    on this machine after the test suite's kills. Removing one is safe whoever made it:
    rmdir refuses a group that has a member, and a live run's group is empty only in the
    milliseconds between its mkdir and its child joining it (the age rule), or after its
    last process exited, when the run's own ``kill_group`` finds it gone and returns 0.
    """
    where = containment()[0]
    if where is None:
        return 0
    removed, now = 0, time.time()
    try:
        groups = [p for p in where.parent.iterdir() if p.name.startswith(GROUP_PREFIX) and p.is_dir()]
    except OSError:
        return 0
    for group in groups:
        try:
            if pids_in_group(group) or now - group.stat().st_mtime < min_age_s:
                continue
            group.rmdir()
            removed += 1
        except OSError:   # busy (a member joined meanwhile), or already gone
            continue
    return removed
