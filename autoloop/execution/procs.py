"""Finding and ending process trees: the one module that kills what autoloop started.

Everything autoloop starts (a trial, an agent call, a job's trial on a node) runs in a
session of its own and carries a private token in its environment (``TOKEN_VAR``), so that
all of it can be found again, also processes that double-forked and left the session:

* :class:`ProcessTree` follows one running command (the runner, for trials and agents):
  its members by (pid, start time), so a reused pid is never hit, with this process as
  the child subreaper while any tree runs (Linux), so orphans stay visible and are reaped;
* :func:`end_leftovers` ends what an interrupted run left behind (recovery after
  ``kill -9`` of the orchestrator), from the pids and token that state.json recorded;
* :func:`end_token_holders` ends every process carrying one token (the slurm executor,
  for a trial that outlived its local job).

The short helpers the orchestrator itself waits on (git, and GitPython's long-lived
``git cat-file`` processes) start in a process group of their own, :data:`OWN_GROUP`: a
terminal's Ctrl-C goes to its whole foreground process group, and it must reach the
orchestrator alone, which then ends its trials and records them with git still working.

and contains each run in a cgroup of its own where the machine allows it (``containment``,
:class:`RunGroup`): a daemon that cleared its environment and left its session cannot
leave its cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autoloop.execution import gitsafe

logger = logging.getLogger(__name__)

TOKEN_VAR = "AUTOLOOP_TRIAL_TOKEN"  # inherited by every descendant that keeps its environment
KILL_WAIT_S = 10.0                  # after SIGKILL, how long to wait for the kernel to finish the job

# Popen keywords for a helper out of the terminal's reach: a process group of its own (a
# background group: git neither reads the terminal nor needs its signals). Use them through
# `terminal_signal_held` or `run_own_group`: alone they leave a window open (below).
OWN_GROUP: dict[str, Any] = {"process_group": 0} if os.name == "posix" else {}
_HELD = {signal.SIGINT} if os.name == "posix" else set()


@contextlib.contextmanager
def terminal_signal_held() -> Iterator[None]:
    """Hold SIGINT in this thread while it starts a child out of the terminal's group.

    CPython starts children with vfork: the child sets every handled signal back to its
    default and unblocks its signals *before* it calls setpgid, so a Ctrl-C landing in that
    window kills the child while it is still in the terminal's group. Measured on two
    threads starting `git --version` 600 times under a stream of group SIGINTs: 136 died
    of the signal; with SIGINT blocked in the starting thread, none (the child starts with
    this thread's mask, and the signal goes to the main thread, which does not block it).
    The child keeps SIGINT blocked: it is in a background group, where no terminal sends one.
    In the main thread a Ctrl-C waits, pending, until the short command returns.
    """
    if not _HELD:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_own_group(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` for a short helper (git), out of the terminal's process group; git
    with no code of anyone else's inside it (`neutral_git`)."""
    with terminal_signal_held():
        if gitsafe.is_git(command):
            command, kwargs["env"] = neutral_git(command, kwargs.get("env"), kwargs.get("cwd"))
        return subprocess.run(command, **OWN_GROUP, **kwargs)


def neutral_git(command: list[str], env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None,
                ) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a git command autoloop starts: hooks, fsmonitor, external
    diffs and filters off (`gitsafe`). Call it with SIGINT held (`terminal_signal_held`)."""
    def listing(argv: list[str], list_env: dict[str, str], where: str | None) -> tuple[int, bytes]:
        done = subprocess.run(argv, env=list_env, cwd=where, capture_output=True, stdin=subprocess.DEVNULL,
                              check=False, **OWN_GROUP)
        return done.returncode, done.stdout

    return gitsafe.prepare(command, os.environ if env is None else env, None if cwd is None else str(cwd), listing)


# ------------------------------------------------------------------------------ a live tree

_subreaper_lock = threading.Lock()
_subreaper_users = 0


def _set_subreaper(on: bool) -> None:
    if not sys.platform.startswith("linux"):
        return
    pr_set_child_subreaper = 36
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, int(on), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: orphans go to init, the final sweep still finds them
        pass


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """This process is the child subreaper while any trial runs (a process-wide flag, so counted)."""
    global _subreaper_users
    with _subreaper_lock:
        _subreaper_users += 1
        if _subreaper_users == 1:
            _set_subreaper(True)
    try:
        yield
    finally:
        with _subreaper_lock:
            _subreaper_users -= 1
            if _subreaper_users == 0:
                _set_subreaper(False)


class ProcessTree:
    """Every process of one trial (or agent call), remembered by (pid, start time) until it is gone."""

    def __init__(self, root: subprocess.Popen[bytes], token: str, group: RunGroup | None = None):
        self._root = root
        self._token = token
        self._group = group   # its cgroup, where the machine allows one: holds what escaped the rest
        self._me = psutil.Process()
        self._known: dict[tuple[int, float], psutil.Process] = {}
        self._foreign: set[tuple[int, float]] = set()  # our other children (another thread's git)
        with contextlib.suppress(psutil.Error):
            self._remember(psutil.Process(root.pid))

    def _remember(self, proc: psutil.Process) -> None:
        self._known[(proc.pid, proc.create_time())] = proc

    def _is_ours(self, proc: psutil.Process) -> bool:
        try:
            if proc.ppid() in {pid for pid, _ in self._known}:
                return True
            return bool(proc.environ().get(TOKEN_VAR) == self._token)
        except psutil.Error:
            return False

    def alive(self) -> list[psutil.Process]:
        """Known processes still running; zombies count as dead (no code, no memory) and the
        dead are forgotten, so a trial spawning thousands of short jobs stays cheap."""
        living = []
        for key, proc in list(self._known.items()):
            try:
                if not proc.is_running():  # gone, or its pid now belongs to someone else
                    raise psutil.NoSuchProcess(proc.pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    living.append(proc)
                    continue
                if proc.pid != self._root.pid and proc.ppid() == self._me.pid:
                    os.waitpid(proc.pid, os.WNOHANG)  # an orphan re-parented to us: reap it
                    continue
                if proc.pid == self._root.pid:
                    continue  # Popen reaps the main process, keeping its exit status
            except (psutil.NoSuchProcess, ChildProcessError):
                pass
            except psutil.Error:
                continue
            del self._known[key]
        return living

    def refresh(self) -> list[psutil.Process]:
        """Take in new descendants, then return the living members. As subreaper, orphans of
        the trial are re-parented to us, so our own descendants hold the whole tree."""
        try:
            descendants = self._me.children(recursive=True)  # parents come before their children
        except psutil.Error:
            descendants = []
        for proc in descendants:
            try:
                key = (proc.pid, proc.create_time())
            except psutil.Error:
                continue
            if key in self._known or key in self._foreign:
                continue
            if self._is_ours(proc):
                self._known[key] = proc
            else:
                self._foreign.add(key)
        return self.alive()

    def sweep(self) -> list[psutil.Process]:
        """refresh() plus a scan of every process for the trial's session or token: finds a
        daemon that left the tree before any sample saw it (where there is no subreaper)."""
        session = self._root.pid  # start_new_session: the session id is the main process's pid
        for proc in psutil.process_iter():
            if proc.pid == self._me.pid:
                continue
            try:
                if os.getsid(proc.pid) == session or proc.environ().get(TOKEN_VAR) == self._token:
                    self._remember(proc)
            except (psutil.Error, OSError):
                continue
        for pid in self._group.pids() if self._group is not None else ():
            with contextlib.suppress(psutil.Error):
                if pid != self._me.pid:
                    self._remember(psutil.Process(pid))
        return self.refresh()

    def members(self) -> list[tuple[int, float]]:
        return list(self._known)

    def rss_bytes(self, procs: list[psutil.Process]) -> int:
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def _signal(self, procs: list[psutil.Process], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._root.pid, sig)  # the group first: members we have not seen yet
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)  # psutil checks the start time: a reused pid is left alone

    def end(self, grace_s: float) -> int:
        """SIGTERM every member, SIGKILL what is left after the grace period, and wait until
        all are gone. Returns how many were alive at the start."""
        living = self.sweep()
        count = len(living)
        if not living:
            return 0
        self._signal(living, signal.SIGTERM)
        self._signal(living, signal.SIGCONT)  # a stopped process only acts on SIGTERM once continued
        terminated = {proc.pid for proc in living}
        deadline = time.monotonic() + grace_s
        while living and time.monotonic() < deadline:
            time.sleep(0.02)
            self._root.poll()
            living = self.refresh()
            late = [proc for proc in living if proc.pid not in terminated]  # born during the grace
            self._signal(late, signal.SIGTERM)
            terminated.update(proc.pid for proc in late)
        deadline = time.monotonic() + KILL_WAIT_S
        while living and time.monotonic() < deadline:
            self._signal(living, signal.SIGKILL)
            time.sleep(0.02)
            self._root.poll()
            living = self.sweep()
        if living:
            logger.error("trial processes survived SIGKILL: %s", [proc.pid for proc in living])
        return count


# ------------------------------------------------------------------------------ leftovers


def find_leftovers(pids: list[tuple[int, float]], token: str | None = None,
                       results_dir: Path | None = None) -> list[psutil.Process]:
    """Every process an interrupted run left: the recorded ones (same pid *and* start time
    only), everything carrying its token, everything in the session of either (agents and
    trials run in sessions of their own), and their descendants.

    With ``results_dir``, also every process carrying a process token (TOKEN_VAR)
    whose AUTOLOOP_RESULT (a trial) or AUTOLOOP_PROMPT_FILE (an agent) lies in it, and then
    everything carrying one of those tokens: a kill that landed before state.json named
    the main process would otherwise orphan the whole run. Safe because the caller holds
    the workspace lock: no live run of this workspace owns such a process.

    A session id cannot be reused while the session has a member, so a session proven ours
    by a live member holds nothing else; our own session is never one of them.
    """
    me = os.getpid()
    left = _Leftovers()
    for proc in _recorded(pids):
        left.take(proc)
    procs = [p for p in psutil.process_iter() if p.pid != me]
    tokens = {token} if token else set()
    if results_dir is not None:
        tokens |= _tokens_of_runs_in(procs, results_dir)
    if tokens:
        for proc in procs:
            try:
                if proc.environ().get(TOKEN_VAR) in tokens:
                    left.take(proc)
            except psutil.Error:
                continue
    left.sessions.discard(os.getsid(0))
    left.add_session_members(procs)
    left.add_descendants(me)
    return _living(left.found.values())


class _Leftovers:
    """What find_leftovers has found so far, by pid, and the sessions of what it took."""

    def __init__(self) -> None:
        self.found: dict[int, psutil.Process] = {}
        self.sessions: set[int] = set()

    def take(self, proc: psutil.Process) -> None:
        self.found[proc.pid] = proc
        with contextlib.suppress(OSError):
            self.sessions.add(os.getsid(proc.pid))

    def add_session_members(self, procs: list[psutil.Process]) -> None:
        for proc in procs:
            try:
                if proc.pid not in self.found and os.getsid(proc.pid) in self.sessions:
                    self.found[proc.pid] = proc
            except OSError:
                continue

    def add_descendants(self, me: int) -> None:
        for proc in list(self.found.values()):
            try:
                for child in proc.children(recursive=True):
                    if child.pid != me:
                        self.found.setdefault(child.pid, child)
            except psutil.Error:
                continue


def _recorded(pids: list[tuple[int, float]]) -> Iterator[psutil.Process]:
    """The recorded processes still running: same pid *and* start time (a pid is reused)."""
    for pid, created in pids:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 1.0:
                yield proc
        except psutil.Error:
            continue


def _tokens_of_runs_in(procs: list[psutil.Process], results_dir: Path) -> set[str]:
    """The process tokens of runs whose result (a trial) or prompt file (an agent) lies in
    results_dir."""
    tokens: set[str] = set()
    prefixes = tuple({str(Path(results_dir).absolute()) + os.sep, str(Path(results_dir).resolve()) + os.sep})
    for proc in procs:
        try:
            env = proc.environ()
            if env.get(TOKEN_VAR) and any(env.get(k, "").startswith(prefixes)
                                          for k in ("AUTOLOOP_RESULT", "AUTOLOOP_PROMPT_FILE")):
                tokens.add(env[TOKEN_VAR])
        except psutil.Error:
            continue
    return tokens


def _living(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    living = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:   # a zombie has nothing left to end
                living.append(proc)
        except psutil.Error:
            continue
    return living


def end_leftovers(pids: list[tuple[int, float]], grace_s: float = 3.0, token: str | None = None,
                  results_dir: Path | None = None) -> int:
    """End what an interrupted run left (see find_leftovers): SIGTERM (and SIGCONT), then
    SIGKILL. Ending the main process alone would orphan its workers and daemons, holding
    memory and the GPU with nobody left to end them."""
    alive = find_leftovers(pids, token, results_dir)
    held = group_of_token(token) if token else None
    if held is not None:   # the run's cgroup: what escaped every other search, and it goes too
        known = {proc.pid for proc in alive}
        for pid in pids_in_group(held[0]):
            with contextlib.suppress(psutil.Error):
                if pid not in known:
                    alive.append(psutil.Process(pid))
    for proc in alive:
        for sig in (signal.SIGTERM, signal.SIGCONT):   # a stopped process acts on SIGTERM once continued
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
    still = wait_gone(alive, grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    wait_gone(still, grace_s)
    if held is not None:
        kill_group(*held)
    return len(alive)


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process has exited; the ones still running after `timeout`. A
    zombie counts as gone: it runs nothing, and an orphan's is its new parent's to reap
    (psutil.wait_procs would wait the whole timeout for it)."""
    deadline = time.monotonic() + timeout
    while True:
        living = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    living.append(proc)
            except psutil.Error:
                pass
        if not living or time.monotonic() >= deadline:
            return living
        procs = living
        time.sleep(0.05)


def end_token_holders(token: str) -> int:
    """SIGKILL every process carrying ``token`` (orphans of a dead job), and the cgroup its
    run was given (a job killed on its node never removed it); how many there were."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(TOKEN_VAR) == token:
                proc.kill()
                found.append(proc)
    psutil.wait_procs(found, timeout=5)
    held = group_of_token(token)
    return len(found) + (kill_group(*held) if held is not None else 0)


# ------------------------------------------------------------------------------ containment

# A trial (or agent call) that calls setsid, double-forks and clears its environment leaves
# the session, the token and, once its parent is gone, the tree: tracking cannot find it.
# A cgroup it is placed in before it runs (between fork and exec) holds it and everything
# it ever starts, whatever it does. Where this machine lets us make cgroups, each run gets
# one, named after its token, under this process's own cgroup: cgroup v2 (as root or with
# a delegated subtree), else cgroup v1's freezer or pids hierarchy. Elsewhere tracking alone.

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

