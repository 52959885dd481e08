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

Cgroup containment, when it comes, belongs here too.
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
from collections.abc import Iterator
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

TOKEN_VAR = "AUTOLOOP_TRIAL_TOKEN"  # inherited by every descendant that keeps its environment
KILL_WAIT_S = 10.0                  # after SIGKILL, how long to wait for the kernel to finish the job

# Popen keywords for a helper out of the terminal's reach: a process group of its own (a
# background group: git neither reads the terminal nor needs its signals).
OWN_GROUP: dict = {"process_group": 0} if os.name == "posix" else {}


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

    def __init__(self, root: subprocess.Popen, token: str):
        self._root = root
        self._token = token
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
            return proc.environ().get(TOKEN_VAR) == self._token
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
    found: dict[int, psutil.Process] = {}
    sessions: set[int] = set()
    me = os.getpid()

    def take(proc: psutil.Process) -> None:
        found[proc.pid] = proc
        try:
            sessions.add(os.getsid(proc.pid))
        except OSError:
            pass

    for pid, created in pids:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 1.0:
                take(proc)
        except psutil.Error:
            continue
    procs = [p for p in psutil.process_iter() if p.pid != me]
    tokens = {token} if token else set()
    if results_dir is not None:
        prefixes = tuple({str(Path(results_dir).absolute()) + os.sep, str(Path(results_dir).resolve()) + os.sep})
        for proc in procs:
            try:
                env = proc.environ()
                if env.get(TOKEN_VAR) and any(env.get(k, "").startswith(prefixes)
                                              for k in ("AUTOLOOP_RESULT", "AUTOLOOP_PROMPT_FILE")):
                    tokens.add(env[TOKEN_VAR])
            except psutil.Error:
                continue
    if tokens:
        for proc in procs:
            try:
                if proc.environ().get(TOKEN_VAR) in tokens:
                    take(proc)
            except psutil.Error:
                continue
    sessions.discard(os.getsid(0))
    for proc in procs:
        try:
            if proc.pid not in found and os.getsid(proc.pid) in sessions:
                found[proc.pid] = proc
        except OSError:
            continue
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                if child.pid != me:
                    found.setdefault(child.pid, child)
        except psutil.Error:
            continue
    living = []
    for proc in found.values():
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
    """SIGKILL every process carrying ``token`` (orphans of a dead job); how many there were."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(TOKEN_VAR) == token:
                proc.kill()
                found.append(proc)
    psutil.wait_procs(found, timeout=5)
    return len(found)
