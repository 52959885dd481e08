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

Where the machine allows it, each run is also contained in a cgroup of its own
(``cgroups.py``): a daemon that cleared its environment and left its session cannot leave
its cgroup; a tree's end and the end of leftovers end that group too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from autoloop.execution import gitsafe
from autoloop.execution.cgroups import KILL_WAIT_S, RunGroup, group_of_token, kill_group, pids_in_group

logger = logging.getLogger(__name__)

TOKEN_VAR = "AUTOLOOP_TRIAL_TOKEN"  # inherited by every descendant that keeps its environment

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
