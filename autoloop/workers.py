"""Parallel workers: `autoloop run --workers N`.

N threads in the one orchestrator process (the work itself is subprocesses: trials and
agents), each a :class:`Worker` with its own git worktree ``worktrees/w<k>`` on branch
``autoloop/<tag>-w<k>``, its own state file ``results/state-w<k>.json`` and its own device.
They share the ledger, the integrity guard and one best, behind one lock (``pool.lock``):

* a worker reserves a trial number and resets its worktree to the current best under the
  lock, then proposes, commits and runs outside it;
* the decision, the ledger append and the move of the loop's branch ``autoloop/<tag>`` (the
  main checkout, which always shows the best) happen under the lock
  (``Session.deciding``/``before_append``/``after_append``);
* a candidate judged while the best has not moved since it started is judged as in the
  single loop. If the best moved: a loss is a discard as usual; a win over its own start is
  recorded as a discard that says so, its change is merged 3-way onto the new best
  (``git merge-file``) and run again as a ``confirm`` attempt of the same trial
  (``extra.replay_of``) that must win there; a change that no longer merges, or is already
  in the best, is ``discard`` with reason ``stale: ...``. Replays are bounded (MAX_REPLAYS).

Every other part (proposing with the git guard and scope guard, committing, running,
classifying, judging, noise confirmations, recovery after kill -9) is the single loop's
``Session``/``Loop`` code, bound to the worker's worktree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from git.exc import GitCommandError

from autoloop.config import Settings, format_duration
from autoloop.console import Console
from autoloop.ledger import Ledger, LedgerRecord
from autoloop.loop import (AttemptPlan, Loop, LoopError, Session, check_isolation, format_metric,
                           workspace_lock)
from autoloop.proposers.base import Proposer
from autoloop.state import RunState, load_state, save_state, set_phase, state_path, worker_state_name
from autoloop.workspace import Workspace, WorkspaceError, _git_error

WORKTREES = "worktrees"
# A winning candidate is replayed on a best that moved at most this many times; a best that
# keeps moving under it makes it stale (each replay costs a full trial).
MAX_REPLAYS = 3


# ------------------------------------------------------------------------------ devices


def cuda_device_count() -> int:
    """CUDA devices visible to us without importing torch (seconds of start-up): the
    CUDA_VISIBLE_DEVICES list when set, else `nvidia-smi -L`; 0 when neither says."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def worker_envs(settings: Settings, n: int, cuda_count: int | None = None) -> tuple[list[dict[str, str]], str]:
    """The environment each worker's trials get, and one line saying what was chosen.

    --devices: one CUDA device each. Else one GPU each when there are at least n, else all
    on the CPU, where each trial gets cores // n threads: n trials asking for every core
    each would oversubscribe them and slow all of them down.
    """
    if settings.devices:
        envs = [{"CUDA_VISIBLE_DEVICES": str(d), "AUTOLOOP_DEVICE": "cuda"} for d in settings.devices[:n]]
        return envs, f"devices: worker k on CUDA device {', '.join(map(str, settings.devices[:n]))} (in order)"
    device = settings.device
    if device is None or device.startswith("cuda"):
        count = cuda_device_count() if cuda_count is None else cuda_count
        if count >= n:
            ids = (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(count)))).split(",")
            ids = [i.strip() for i in ids if i.strip()][:n]
            return ([{"CUDA_VISIBLE_DEVICES": i, "AUTOLOOP_DEVICE": "cuda"} for i in ids],
                    f"devices: one GPU per worker ({', '.join(ids)})")
        if device is not None:
            raise LoopError(f"--workers {n} with --device {device} needs {n} CUDA devices, {count} visible; "
                            f"pass --devices or fewer --workers")
        gpus = f" ({count} GPU(s) visible: fewer than the workers; --devices assigns them)" if count else ""
    else:
        gpus = ""
    cores = os.cpu_count() or 1
    threads = str(max(1, cores // n))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if device in (None, "cpu") or device.startswith("cuda"):
        env.update(AUTOLOOP_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    return [dict(env) for _ in range(n)], (f"devices: {n} workers share {cores} CPU cores, "
                                           f"{threads} thread(s) per trial{gpus}")


# ------------------------------------------------------------------------------ git


def merge_change(ws: Workspace, base: str, ours: str, theirs: str) -> str | None:
    """The target of `theirs` (a candidate built on `base`) replayed onto `ours` (the new
    best): a 3-way merge of the target alone; None on a conflict or a file missing."""
    texts = [ws.file_at(sha, ws.target) for sha in (ours, base, theirs)]
    if any(t is None for t in texts):
        return None
    with tempfile.TemporaryDirectory(prefix="autoloop-merge-") as tmp:
        paths = []
        for name, text in zip(("ours", "base", "theirs"), texts):
            path = Path(tmp) / name
            path.write_text(text)
            paths.append(str(path))
        # Exit code: the number of conflicts (0: clean), negative (255) on an error.
        out = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


class WorkerWorkspace(Workspace):
    """A worker's linked worktree: its own branch, and refs the other workers move meanwhile
    that the git guard must not take for the proposer's doing."""

    def __init__(self, path: Path, target: str, results_dir: Path, branch: str, loop_branch: str):
        super().__init__(path, target, str(results_dir))
        self.branch = branch
        self.foreign_refs = (f"refs/heads/{loop_branch}",)   # the loop's branch and every worker's

    def branch_name(self, tag: str) -> str:   # noqa: ARG002 - the git guard asks by tag
        return self.branch


def worktree_path(root: Path, worker: int) -> Path:
    return Path(root) / WORKTREES / f"w{worker}"


def ensure_worktrees_ignored(ws: Workspace) -> None:
    """worktrees/ must be ignored by the main checkout (else its clean-tree check, scope
    guard and resets would see the workers' files): added to .git/info/exclude when the
    user's .gitignore does not already ignore it."""
    try:
        ws.repo.git.check_ignore("-q", f"{WORKTREES}/w0/probe")
        return
    except GitCommandError as err:
        if err.status != 1:
            raise LoopError(f"git check-ignore failed: {_git_error(err)}") from None
    common = Path(ws.repo.git.rev_parse("--git-common-dir"))
    exclude = (common if common.is_absolute() else ws.root / common) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n")
                       + f"# autoloop parallel workers' git worktrees\n/{WORKTREES}/\n")


def ensure_worktree(ws: Workspace, path: Path, branch: str, at: str) -> None:
    """A worktree of the repository at `path` on `branch`; created at `at` when missing
    (a folder left half-made by a kill is replaced). An existing one is left as it is: it
    may hold an interrupted attempt's edit, which recovery saves."""
    if (path / ".git").is_file():
        try:
            existing = Workspace(path)
            ok = existing.root == path.resolve()
            existing.close()
            if ok:
                return
        except WorkspaceError:
            pass   # a worktree git no longer knows: made again
    if path.exists():
        shutil.rmtree(path)
    try:
        ws.repo.git.worktree("prune")
        ws.repo.git.worktree("add", "-q", "-f", "-B", branch, str(path), at)
    except GitCommandError as err:
        raise LoopError(f"cannot create the worker worktree {path}: {_git_error(err)}") from None


def remove_worktree(ws: Workspace, path: Path, branch: str) -> None:
    try:
        ws.repo.git.worktree("remove", "--force", str(path))
    except GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
        ws.repo.git.worktree("prune")
    try:
        ws.repo.git.branch("-D", branch)
    except GitCommandError:
        pass


# ------------------------------------------------------------------------------ a worker


class _Prefixed:
    """The shared console, each line marked with the worker it comes from."""

    def __init__(self, console: Console, prefix: str):
        self._console, self._prefix = console, prefix

    def line(self, text: str) -> None:
        self._console.line(f"{self._prefix} {text}")

    def status(self, text: str) -> None:
        self._console.status(f"{self._prefix} {text}")

    def error(self, text: str) -> None:
        self._console.error(f"{self._prefix} {text}")


class _LockedGuard:
    """The integrity guard is one for all workers: its checks (and restores) one at a time."""

    def __init__(self, guard, lock):
        self._guard, self._lock = guard, lock

    def check(self, evidence_dir=None):
        with self._lock:
            return self._guard.check(evidence_dir)


class WorkerLedger(Ledger):
    """The shared ledger as one worker writes it: every record says which worker, and a
    record that does not set a new best carries the best as it is *now* (another worker
    may have moved it since this attempt began), so the ledger's best only ever improves."""

    def __init__(self, results_dir: Path, worker: int, lock):
        super().__init__(results_dir)
        self.worker, self._pool_lock = worker, lock

    def append(self, record, write_tsv: bool = True) -> None:
        with self._pool_lock:
            if isinstance(record, LedgerRecord):
                record.worker = self.worker
                if record.status != "keep" and record.kind != "baseline":
                    record.best, record.best_metric = self.best()
            super().append(record, write_tsv)


class WorkerSession(Session):
    """Session machinery bound to worker k's worktree, sharing the pool's ledger and best."""

    def __init__(self, pool: WorkerPool, k: int):
        super().__init__(pool.settings, pool.worktree(k), _Prefixed(pool.console, f"[w{k}]"))
        self.pool, self.worker = pool, k
        self.tag = pool.tag
        self.ws.close()
        self.ws = WorkerWorkspace(pool.worktree(k), pool.settings.target, pool.results_dir,
                                  pool.branch(k), pool.main.ws.branch_name(pool.tag))
        self.results_dir = pool.results_dir
        self.ledger = WorkerLedger(self.results_dir, k, pool.lock)
        self.state_name = worker_state_name(k)
        self.stop_event = pool.main.stop_event
        self.trial_env = pool.envs[k] if pool.envs else {}
        self.start: tuple[str, float | None] | None = None   # the best this worker's trial started from
        self.pending_replay: str | None = None               # the merged target to replay, when one is due
        self.replays = 0

    @property
    def stop_signal(self) -> str | None:   # the signal handler is the main thread's
        return self.pool.main.stop_signal if hasattr(self, "pool") else None

    @stop_signal.setter
    def stop_signal(self, value) -> None:
        pass

    def attach(self) -> None:
        """Data and guard as the main session prepared them."""
        main = self.pool.main
        self.data_dir, self.fingerprint = main.data_dir, main.fingerprint
        self.guard = _LockedGuard(main.guard, self.pool.lock) if main.guard is not None else None

    def best(self) -> tuple[str | None, float | None]:
        # During a trial: the best it started from (what it is built on and judged against).
        return self.start or self.ledger.best()

    def deciding(self):
        return self.pool.lock

    def before_append(self, record: LedgerRecord, plan: AttemptPlan) -> None:
        """Judge against the best as it is now (under the lock): see the module docstring."""
        self.pending_replay = None
        if plan.replay_of:
            record.extra["replay_of"] = plan.replay_of
        current, current_metric = self.ledger.best()
        if plan.kind == "baseline" or plan.noise_sample or current == plan.parent or current is None:
            return
        won = record.status == "keep" or record.extra.get("confirm") == "pending"
        record.best, record.best_metric = current, current_metric
        if not won:
            if record.status == "discard":
                record.reason = f"{record.reason} (best has moved to {current[:7]} meanwhile)"
            return
        record.extra.pop("confirm", None)
        record.status = "discard"
        record.extra["beat_start"] = plan.parent
        how = f"beat its start {plan.parent[:7]} ({record.reason})"
        merged = merge_change(self.ws, plan.parent, current, record.commit) if record.commit else None
        if self.replays >= MAX_REPLAYS:
            record.reason, record.extra["stale"] = f"stale: {how} but the best kept moving ({MAX_REPLAYS} replays)", True
        elif merged is None:
            record.reason = f"stale: {how} but its change conflicts with the new best {current[:7]}"
            record.extra["stale"] = True
        elif merged == self.ws.file_at(current, self.ws.target):
            record.reason = f"stale: {how} but its change is already in the new best {current[:7]}"
            record.extra["stale"] = True
        else:
            record.reason = f"{how}; the best moved to {current[:7]}: replaying it there"
            record.extra["replay"] = "pending"
            self.pending_replay = merged

    def after_append(self, record: LedgerRecord) -> None:
        if record.status == "keep" and record.best:
            self.pool.publish(record.best)


class Worker(Loop):
    """One worker thread: Loop's trial logic (propose, fix, confirm) on a WorkerSession."""

    def __init__(self, pool: WorkerPool, k: int):   # noqa: D107 - Loop.__init__ would make a Session
        self.pool, self.k = pool, k
        self.settings = pool.settings
        self.session = WorkerSession(pool, k)
        self.console = self.session.console
        self.proposer = pool.proposer

    def _propose(self, request):
        # The queue and the mutator are quick: one at a time, so two workers never draw the
        # same move from the same memory. An agent works in parallel (that is the point).
        with (self.pool.propose_lock if self.proposer.name != "agent" else nullcontext()):
            request.in_flight = self.pool.in_flight(self.k)
            result = super()._propose(request)
            if result[0] is not None:
                with self.pool.lock:
                    # #18: "trial" tells the optuna proposer which of its suggestions are still running.
                    self.pool.descriptions[self.k] = {"parent": request.best_commit, "kind": "candidate",
                                                      "description": result[0].description, "worker": self.k,
                                                      "trial": request.trial}
            return result

    def _fix(self, trial, attempt, failed, best, best_metric):
        if self.session.ledger.best()[0] != best:
            return None   # the fix would be built on a best the worktree no longer holds
        return super()._fix(trial, attempt, failed, best, best_metric)

    def _confirm(self, record: LedgerRecord, best: str, best_metric: float | None) -> LedgerRecord:
        ss = self.session
        record = ss.confirm(record, best, best_metric)
        while ss.pending_replay is not None and not ss.stop_event.is_set():
            merged, ss.pending_replay = ss.pending_replay, None
            ss.replays += 1
            new_best, new_metric = record.best, record.best_metric
            ss.start = (new_best, new_metric)
            # run_attempt left the worktree at the new best: the replayed change goes on top.
            ss.ws.target_path.write_text(merged)
            attempt = max(r.attempt for r in ss.ledger.attempts_of(record.trial)) + 1
            record = ss.run_attempt(AttemptPlan(
                record.trial, attempt, "confirm", record.description, record.proposer, new_best, new_metric, [],
                record.extra.get("source"), replay_of=record.commit))
            record = ss.confirm(record, new_best, new_metric)
        return record

    def work(self) -> None:
        pool, ss = self.pool, self.session
        try:
            while True:
                with pool.lock:
                    reason = pool.stop_reason()
                    if reason:
                        pool.stop(reason)
                        return
                    trial = pool.reserve(self.k)
                    ss.start = ss.ledger.best()
                ss.ws.reset_to(ss.start[0])   # always propose on the current best
                ss.replays, ss.pending_replay = 0, None
                outcome = "failed"
                try:
                    outcome = self._one_trial(trial)
                finally:
                    ss.start = None
                    pool.release(self.k, outcome)
        except BaseException as e:   # noqa: BLE001 - handed to the main thread, which reports it
            pool.fail(e)


# ------------------------------------------------------------------------------ the pool


class WorkerPool:
    """`autoloop run --workers N`: baseline first (main checkout), then N workers."""

    def __init__(self, settings: Settings, workdir: Path, proposer: Proposer, console: Console | None = None):
        self.settings = settings
        self.loop = Loop(settings, workdir, proposer, console)   # its session: the main checkout
        self.main = self.loop.session
        self.console = self.main.console
        self.proposer = proposer
        self.results_dir = self.main.results_dir
        self.n = settings.workers
        self.lock = threading.RLock()          # the shared best: decisions, records, branch moves
        self.propose_lock = threading.Lock()
        self.envs: list[dict[str, str]] = []
        self.reserved: dict[int, int] = {}     # worker -> trial in flight
        self.descriptions: dict[int, str] = {}
        self.started = 0                       # trials started by this run (failed proposals excluded)
        self.failures = 0                      # failed proposals in a row, all workers together
        self.exhausted = False
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.deadline: float | None = None

    @property
    def tag(self) -> str:
        return self.main.tag

    @property
    def root(self) -> Path:
        return self.main.ws.root

    def worktree(self, k: int) -> Path:
        return worktree_path(self.root, k)

    def branch(self, k: int) -> str:
        return f"{self.main.ws.branch_name(self.tag)}-w{k}"

    # -- shared bookkeeping (callers hold self.lock) --------------------------------------

    def reserve(self, k: int) -> int:
        """A trial number no other worker holds (the ledger's next one counts only records)."""
        trial = max([self.main.ledger.next_trial(), *(t + 1 for t in self.reserved.values())])
        self.reserved[k] = trial
        return trial

    def release(self, k: int, outcome: str) -> None:
        with self.lock:
            self.reserved.pop(k, None)
            self.descriptions.pop(k, None)
            if outcome == "exhausted":
                self.exhausted = True
            elif outcome == "failed":
                self.failures += 1
            else:
                self.failures = 0
                self.started += 1

    def in_flight(self, k: int) -> list[dict]:
        """What the other workers are trying now, for the proposer's memory (the mutator
        then does not draw the same move twice at once)."""
        with self.lock:
            return [dict(d) for w, d in self.descriptions.items() if w != k]

    def stop_reason(self) -> str | None:
        """The single loop's stop conditions (Loop._stop_reason), counting reserved trials as
        started, plus the pool's own: a worker's fatal error, a proposer out of ideas."""
        if self.reason:
            return self.reason
        if self.exhausted and not self.main.stop_event.is_set():
            return f"proposer '{self.proposer.name}' has no more ideas"
        return self.loop._stop_reason(self.started + len(self.reserved), self.failures, self.deadline)

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self.error = self.error or error
            self.reason = self.reason or f"a worker failed: {error}"
        self.main.stop_event.set()   # the other workers' trials end now, recorded as interrupted

    def publish(self, best: str) -> None:
        """The loop's branch (checked out in the main checkout) follows the ledger's best."""
        if self.main.ws.head() != best:
            self.main.ws.reset_to(best)

    # -- the run ----------------------------------------------------------------------------

    def worker_states(self) -> list[tuple[int, RunState]]:
        found = []
        for path in sorted(self.results_dir.glob("state-w*.json")):
            number = path.stem.removeprefix("state-w")
            if number.isdigit():
                found.append((int(number), load_state(self.results_dir, path.name)))
        return found

    def run(self) -> str:
        s, ss = self.settings, self.main
        check_isolation(s)
        ss.check_workspace()
        with workspace_lock(ss.results_dir), ss.graceful_signals():
            ss.repair_ledger()
            try:
                ensure_worktrees_ignored(ss.ws)
            except GitCommandError as err:
                raise LoopError(f"cannot ignore {WORKTREES}/: {_git_error(err)}") from None
            interrupted = [(k, st) for k, st in self.worker_states() if st.in_flight]
            if s.resume:
                ss.recover()
                self._recover_workers(interrupted)
            elif (load_state(ss.results_dir).in_flight and load_state(ss.results_dir).tag == ss.tag) or \
                    any(st.tag == ss.tag for _, st in interrupted):
                raise LoopError("the last run of this tag was interrupted; pass --resume to recover and continue")
            if s.resume and interrupted:
                self._repair_main_checkout()
            try:
                ss.ws.ensure_clean()
                if not s.resume:
                    ss.archive_other_tag()
                    for k, st in self.worker_states():
                        if not st.in_flight:
                            state_path(self.results_dir, worker_state_name(k)).unlink(missing_ok=True)
                ss.ws.start_branch(ss.tag, resume=s.resume)
            except WorkspaceError as e:
                raise LoopError(str(e)) from None
            best = ss.best()[0]
            if best and ss.ws.head() != best:
                ss.ws.reset_to(best)   # killed between a worker's record and the branch move
            ss.prepare_data()
            self.envs, why = worker_envs(s, self.n)
            started = time.time()
            self.deadline = started + s.hours * 3600 if s.hours else None
            ss.state = RunState(tag=ss.tag, pid=os.getpid(), run_started_at=started, deadline=self.deadline,
                                workers=self.n)
            save_state(ss.results_dir, ss.state)
            self.console.line(f"autoloop on {ss.ws.branch_name(ss.tag)}: {self.n} workers, proposer "
                              f"{self.proposer.name}, budget {format_duration(s.budget)}, timeout "
                              f"{format_duration(s.timeout_s)}; {why}")
            reason = self._baseline() or self._run_workers()
            ss.state = set_phase(ss.results_dir, ss.state, "stopped", stop_reason=reason, stopped_at=time.time())
            best, best_metric = ss.best()
            self.console.line(f"stopped: {reason}. best {format_metric(best_metric)} at {best[:7] if best else '-'}")
            if self.error is not None:
                if isinstance(self.error, (LoopError, WorkspaceError)):
                    raise LoopError(str(self.error)) from None
                raise self.error
            return reason

    def _repair_main_checkout(self) -> None:
        """Killed while a worker moved the loop's branch (a reset of the main checkout): we hold
        the workspace lock, so an index.lock is a leftover, and the checkout goes to the best."""
        ss = self.main
        (Path(ss.ws.repo.git_dir) / "index.lock").unlink(missing_ok=True)
        best = ss.best()[0]
        if best and ss.ws.current_branch() == ss.ws.branch_name(ss.tag) and ss.ws.head() != best:
            ss.ws.reset_to(best)

    def _recover_workers(self, interrupted: list[tuple[int, RunState]]) -> None:
        """Each worker's interrupted attempt recorded (candidate kept under its trial ref)."""
        for k, st in interrupted:
            ensure_worktree(self.main.ws, self.worktree(k), self.branch(k), st.best or self.main.ws.head())
            session = WorkerSession(self, k)
            session.recover()
            session.ws.close()
            state_path(self.results_dir, worker_state_name(k)).unlink(missing_ok=True)

    def _baseline(self) -> str | None:
        """The baseline and its noise runs, in the main checkout, before any worker starts."""
        ss = self.main
        low_disk = ss.low_disk()
        if low_disk:
            return low_disk
        if ss.baseline_record() is None:
            if self.deadline is not None and time.time() + self.loop._expected_trial_seconds() > self.deadline:
                return "time is up: not even the baseline fits before the --hours deadline"
            ss.run_baseline()
            ss.measure_noise()
        elif self.settings.remeasure:
            ss.measure_noise()
        return None

    def _run_workers(self) -> str:
        best = self.main.best()[0]
        workers = []
        for k in range(self.n):
            ensure_worktree(self.main.ws, self.worktree(k), self.branch(k), best)
            worker = Worker(self, k)
            worker.session.attach()
            worker.session.ws.reset_to(best)
            workers.append(worker)
        threads = [threading.Thread(target=w.work, name=f"autoloop-w{w.k}", daemon=True) for w in workers]
        for t in threads:
            t.start()
        # Join in slices: the main thread must stay free to take SIGINT/SIGTERM.
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)
        for w in workers:
            w.session.ws.close()
        best = self.main.best()[0]
        if best:
            self.publish(best)
        if self.error is None and not any(st.in_flight for _, st in self.worker_states()):
            # A clean stop: the worktrees go (a resume makes them again); their files are
            # all in the ledger, the trial refs and results/.
            for k in range(self.n):
                remove_worktree(self.main.ws, self.worktree(k), self.branch(k))
                state_path(self.results_dir, worker_state_name(k)).unlink(missing_ok=True)
        if self.error is None and self.main.stop_event.is_set():
            # A signal ends the run even when a worker had found another reason first.
            return f"stopped by {self.main.stop_signal or 'request'}"
        return self.reason or "stopped"
