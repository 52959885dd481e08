"""The orchestrator: propose -> guard -> commit -> run -> classify -> decide -> record, again.

Crash safety rests on two files and one ordering:

* ``results/state.json`` (``state.py``) says which attempt is in flight and in what
  phase, and is written *before* each phase starts;
* ``results/ledger.jsonl`` is the commit point: an attempt has happened once its record
  is appended, and the record carries the best commit after its decision;
* git follows the ledger: after a record is appended the branch is moved to the
  record's best commit, and only then is the state set back to idle.

So whatever moment a ``kill -9`` lands on, the next ``autoloop run --resume`` either
finds the attempt's record (and makes git agree with it) or does not (and records the
attempt as interrupted after saving its candidate to a trial ref). Nothing tried is
lost, the branch always ends at the best commit.
"""

from __future__ import annotations

import os
import secrets
import signal
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from autoloop import git_guard
from autoloop.classify import classify
from autoloop.config import Settings, format_duration
from autoloop.console import Console
from autoloop.data import CorpusSpec, ensure_prepared
from autoloop.decide import decide, judge_runs, noise_estimate
from autoloop.diskspace import low_disk_reason
from autoloop.executors import ExecutorError, cancel_job, make_executor
from autoloop.isolate import isolation_available
from autoloop.integrity import IntegrityError, Tampering, harness_path, open_guard, recover_inputs, tampered_reason
from autoloop.ledger import Ledger, LedgerRecord
from autoloop.proposers.base import FixContext, Proposal, ProposalFailed, Proposer, ProposalRequest
from autoloop.report import format_verdict, live_line
from autoloop.runner import TOKEN_VAR, TrialOutcome, TrialSpec, build_env
from autoloop.runlog import finish_log
from autoloop.state import STATE_FILE, RunState, load_state, save_state, set_phase
from autoloop.workspace import Workspace, WorkspaceError

LOCK_NAME = ".autoloop.lock"
PROGRAM_FILE = "program.md"
LEDGER_TAIL_FOR_PROPOSER = 20


class LoopError(Exception):
    """The loop cannot start or go on; the message is one line for the user."""


@dataclass
class AttemptPlan:
    trial: int
    attempt: int
    kind: str                 # baseline | candidate | fix | confirm
    description: str
    proposer: str
    parent: str               # best commit the attempt is judged against
    parent_metric: float | None
    outside_changes: list[str]
    source: str | None = None
    seed: int | None = None                   # None: settings.seed
    prior_runs: list[float] | None = None     # metrics of earlier runs of the same commit
    noise_sample: tuple[int, int] | None = None   # (k, N): a run of the best to estimate noise
    can_confirm: bool = True                  # a within-noise gain may be re-run once
    git_events: list[str] = field(default_factory=list)   # what the proposer did to git (git_guard)
    replay_of: str | None = None              # workers: a confirm that commits a candidate replayed on a new best
    extra: dict = field(default_factory=dict)  # #18: Proposal.extra, carried into the record's extra


# ------------------------------------------------------------------------------ helpers


@contextmanager
def workspace_lock(results_dir: Path):
    """Hold the workspace: a second orchestrator (or `autoloop trial`) is refused at once."""
    results_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(results_dir / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = load_state(results_dir).pid
        who = f" (pid {holder})" if holder else ""
        raise LoopError(f"another autoloop is already running in this workspace{who}; "
                        "watch it with `autoloop status`") from None
    try:
        yield
    finally:
        lock.release()


def leftover_processes(pids: list[tuple[int, float]], token: str | None = None,
                       results_dir: Path | None = None) -> list[psutil.Process]:
    """Every process an interrupted run left: the recorded ones (same pid *and* start time
    only), everything carrying its token, everything in the session of either (agents and
    trials run in sessions of their own), and their descendants.

    With ``results_dir``, also every process carrying a runner token (runner.TOKEN_VAR)
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


def end_processes(pids: list[tuple[int, float]], grace_s: float = 3.0, token: str | None = None,
                  results_dir: Path | None = None) -> int:
    """End what an interrupted run left (see leftover_processes): SIGTERM (and SIGCONT), then
    SIGKILL. Ending the main process alone would orphan its workers and daemons, holding
    memory and the GPU with nobody left to end them."""
    alive = leftover_processes(pids, token, results_dir)
    for proc in alive:
        for sig in (signal.SIGTERM, signal.SIGCONT):   # a stopped process acts on SIGTERM once continued
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
    still = _wait_gone(alive, grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _wait_gone(still, grace_s)
    return len(alive)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
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


def fault_point(name: str, trial: int | None, attempt: int | None = None) -> None:
    """Fault injection for the resume tests and the soak benchmark: with
    AUTOLOOP_FAULT_KILL_AT=<point>:<trial> (or <point>:<trial>.<attempt>, e.g. running:1.2
    for a confirmation re-run) the orchestrator SIGKILLs itself there."""
    wanted = os.environ.get("AUTOLOOP_FAULT_KILL_AT")
    if wanted and (wanted == f"{name}:{trial}" or wanted == f"{name}:{trial}.{attempt}"):
        os.kill(os.getpid(), signal.SIGKILL)


def strip_audit(record: dict) -> dict:
    """A ledger record without any held-out audit figure (top level or nested, e.g. in extra):
    what a proposer may see."""
    return {k: strip_audit(v) if isinstance(v, dict) else v
            for k, v in record.items() if not str(k).startswith("audit")}


def check_isolation(settings: Settings) -> None:
    """--isolate where the system cannot give trials a network namespace: refuse before
    anything runs, rather than run trials with the network the user wanted them kept off."""
    if settings.isolate:
        ok, why = isolation_available()
        if not ok:
            raise LoopError(f"--isolate: network namespaces are not available here ({why}); run without --isolate")


def format_metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


# ------------------------------------------------------------------------------ session


class Session:
    """One workspace held by one process: git, ledger, state, data, and attempt execution.

    Used by ``autoloop run`` (through :class:`Loop`) and by ``autoloop trial``.
    """

    def __init__(self, settings: Settings, workdir: Path, console: Console | None = None):
        self.settings = settings
        self.console = console or Console()
        try:
            self.ws = Workspace(Path(workdir), settings.target)
        except WorkspaceError as e:
            raise LoopError(str(e)) from None
        self.results_dir = self.ws.results_dir
        self.ledger = Ledger(self.results_dir)
        self.state = RunState()
        self.tag = settings.run_tag
        previous = load_state(self.results_dir)
        if settings.resume and settings.tag is None and previous.tag:
            # A night that began on nov29 resumes on nov30 under its own tag.
            self.tag = previous.tag
        self.stop_event = threading.Event()
        self.stop_signal: str | None = None
        self._progress_saved_at = 0.0
        self.data_dir: Path | None = None
        self.fingerprint: str | None = None
        self.guard = None    # integrity.Guard over harness, program.md and data; set by prepare_data
        try:   # where trials run (autoloop.executors): here, or as slurm jobs
            self.executor = make_executor(settings, self.ws.root)
        except ExecutorError as e:
            raise LoopError(str(e)) from None
        self.state_name = STATE_FILE    # a parallel worker keeps its own (workers.py)
        self.trial_env: dict[str, str] = {}   # added to every trial's environment (a worker's device, threads)

    # -- start-up ------------------------------------------------------------------------

    def check_workspace(self) -> None:
        try:
            self.ws.check_target()
            self.ws.ensure_results_ignored()
        except WorkspaceError as e:
            raise LoopError(str(e)) from None

    def repair_ledger(self) -> None:
        report = self.ledger.repair()
        if report:
            self.console.line(f"ledger: {report}")

    def prepare_data(self, reuse_snapshot: bool = False) -> None:
        spec = CorpusSpec(source=self.settings.corpus)
        info = ensure_prepared(spec, self.settings.data_dir)
        self.data_dir = info.data_dir
        self.fingerprint = info.meta["fingerprint"]
        verb = "prepared" if info.built else "data"
        self.console.line(f"{verb}: {info.meta['source']} -> {info.data_dir} (fingerprint {self.fingerprint})")
        baseline = self.baseline_record()
        if baseline and baseline.fingerprint and baseline.fingerprint != self.fingerprint:
            raise LoopError(f"the data changed since this branch's baseline (fingerprint {baseline.fingerprint}, "
                            f"now {self.fingerprint}); results would not be comparable: start a new --tag")
        try:
            self.guard = open_guard(self.results_dir, self.ws.root, self.data_dir, self.tag, reuse=reuse_snapshot,
                                    evidence_dir=self.results_dir / "quarantine" / "prepared-data")
        except IntegrityError as e:
            raise LoopError(str(e)) from None

    def baseline_record(self) -> LedgerRecord | None:
        for record in self.ledger.records():
            if record.kind == "baseline" and record.status == "keep":
                return record
        return None

    def best(self) -> tuple[str | None, float | None]:
        return self.ledger.best()

    def archive_other_tag(self) -> None:
        """A ledger of another tag moves to results/archive/ before a new tag starts."""
        previous = load_state(self.results_dir).tag
        if not self.ledger.path.exists() or previous in (None, self.tag):
            return
        dest = self.results_dir / "archive" / f"{previous}-{time.strftime('%Y%m%d-%H%M%S')}"
        dest.mkdir(parents=True)
        for name in ("ledger.jsonl", "results.tsv", "state.json", "runs", "agents", "quarantine",
                     "progress.png", "report.md"):
            if (self.results_dir / name).exists():
                os.replace(self.results_dir / name, dest / name)
        self.console.line(f"results of tag '{previous}' moved to {dest.relative_to(self.ws.root)}")

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring an attempt interrupted by a crash of the orchestrator to a clean end."""
        state = load_state(self.results_dir, self.state_name)
        self.state = state
        if not state.in_flight:
            return
        if state.tag and state.tag != self.tag:
            raise LoopError(f"an attempt of tag '{state.tag}' was interrupted; resume it with "
                            f"--resume --tag {state.tag} first")
        # A kill between the ledger append and the results.tsv rewrite leaves the table a
        # row short; the ledger is the truth, the table is rebuilt from it.
        self.ledger.write_tsv()
        cancelled = cancel_job(state.job)   # a job of the interrupted trial still queued or running
        if cancelled:
            self.console.line(f"recovery: {cancelled}")
        ended = end_processes(state.child_pids, token=state.child_token, results_dir=self.results_dir)
        if ended:
            self.console.line(f"recovery: ended {ended} process(es) left by the interrupted trial")
        if state.trial is not None and state.attempt is not None:
            try:  # a capped log left in pieces by the kill
                finish_log(self.results_dir / self.log_rel(state.trial, state.attempt))
            except OSError as e:
                self.console.line(f"recovery: the log of the interrupted trial stays in pieces ({e})")
        # Killed after the trial but before its check: put the measurement's inputs back first.
        tampered = recover_inputs(self.results_dir, self.tamper_dir(state.trial, state.attempt))
        if tampered:
            self.console.line(f"recovery: {tampered_reason(tampered.paths)} (by the interrupted attempt); restored")
        if tampered.unrestorable:
            raise LoopError(tampered.message)
        index_lock = Path(self.ws.repo.git_dir) / "index.lock"   # a linked worktree's own git dir too
        if index_lock.exists():
            # We hold the workspace lock, so no git command of ours is running: the lock was
            # left by a git process killed with us.
            index_lock.unlink()
        existing = [r for r in self.ledger.records() if r.trial == state.trial and r.attempt == state.attempt]
        if existing:
            record = existing[-1]
            best = record.best or state.best
            self.console.line(f"recovery: trial {state.trial}.{state.attempt} was recorded ({record.status}); "
                              f"restoring the branch to {best[:7]}")
        else:
            best = state.best or self.ws.head()
            candidate = state.candidate
            events: list[str] = []
            deleted = False
            if state.phase == "proposing" and state.best:
                # The proposer may have committed, switched branch or reset before the kill.
                try:
                    guard = git_guard.reconcile(self.ws, self.tag, best, state.trial, state.attempt or 1)
                except WorkspaceError as e:
                    raise LoopError(str(e)) from None
                events, deleted = guard.events, guard.target_deleted
                if events:
                    self.console.line(f"recovery: git: {'; '.join(events)}")
            head = self.ws.head()
            if candidate is None and head != best and self.ws.is_ancestor(best, head):
                candidate = head   # committed, killed before the state said so
            if candidate is None and state.kind not in ("baseline", "confirm"):
                self.ws.scope_guard(self.quarantine_dir(state.trial, state.attempt), base=best)
                if self.ws.target_changed() and not deleted:
                    candidate = self.ws.commit_candidate(f"{state.description or 'interrupted candidate'}"
                                                         f"\n\nautoloop trial {state.trial}.{state.attempt} (interrupted)")
            ref = self.ws.save_trial_ref(self.tag, state.trial, state.attempt, candidate) if candidate else None
            now = time.time()
            record = LedgerRecord(
                trial=state.trial, attempt=state.attempt or 1, kind=state.kind or "candidate",
                started_at=state.attempt_started_at or now, ended_at=now, proposer=state.proposer or "-",
                parent=state.best, commit=candidate, description=state.description or "interrupted",
                status="crash", crash="fundamental", reason=f"interrupted (orchestrator stopped during {state.phase})"
                + (f"; {tampered_reason(tampered.paths)}" if tampered else ""),
                metric_name=self.settings.metric, seed=self.settings.seed, best=best, best_metric=state.best_metric,
                log_path=self.log_rel(state.trial, state.attempt),
                extra={**({"tampered": tampered.paths} if tampered else {}),
                       **({"git_events": events} if events else {})},
            )
            if state.kind == "baseline":
                record.best, record.best_metric = None, None
            self.ledger.append(record)
            self.console.line(f"recovery: trial {state.trial}.{state.attempt} was interrupted during "
                              f"{state.phase}; recorded as crash, candidate kept at {ref or '(none)'}")
        self.ws.reset_to(best)
        self.state = set_phase(self.results_dir, state, "idle", self.state_name, candidate=None, child_pids=[],
                               job=None, progress=None)

    # -- paths ---------------------------------------------------------------------------

    def low_disk(self) -> str | None:
        """The stop reason when a disk the loop writes to is under --min-free-gb."""
        return low_disk_reason([self.results_dir, self.ws.root, self.data_dir], self.settings.min_free_gb)

    def log_rel(self, trial, attempt) -> str:
        return f"runs/{trial}-{attempt}.log"

    def quarantine_dir(self, trial, attempt) -> Path:
        return self.results_dir / "quarantine" / f"{trial}-{attempt}"

    def tamper_dir(self, trial, attempt) -> Path:
        """Where the changed versions of protected inputs go when they are restored."""
        return self.results_dir / "quarantine" / f"{trial}-{attempt}-tampered"

    # -- one attempt ---------------------------------------------------------------------

    def program_text(self) -> str:
        path = self.ws.root / PROGRAM_FILE
        return path.read_text() if path.exists() else ""

    def proposal_request(self, trial: int, attempt: int, fix: FixContext | None = None) -> ProposalRequest:
        best, best_metric = self.best()
        tail = [strip_audit(r) for r in self.ledger.last(LEDGER_TAIL_FOR_PROPOSER)]
        return ProposalRequest(
            workspace=self.ws.root, target=self.settings.target, program_text=self.program_text(),
            metric_name=self.settings.metric, direction=self.settings.direction, best_metric=best_metric,
            best_commit=best, trial=trial, attempt=attempt, seed=self.settings.seed, ledger_tail=tail,
            fix=fix, results_dir=self.results_dir, stop_event=self.stop_event, on_start=self._remember_children,
        )

    def enter(self, phase: str, **fields) -> None:
        self.state = set_phase(self.results_dir, self.state, phase, self.state_name, **fields)
        fault_point(phase, self.state.trial, self.state.attempt)

    def run_attempt(self, plan: AttemptPlan) -> LedgerRecord:
        """Commit the target's edit (unless baseline/confirm), run it, judge it, record it,
        and leave the branch at the best commit."""
        s = self.settings
        # A proposer may have changed a protected input while proposing: restored, the run
        # is then a valid measurement, and the record says what was found.
        before = self.check_inputs(plan.trial, plan.attempt)
        if before.unrestorable:
            raise LoopError(before.message)
        started = time.time()
        self.enter("committing", trial=plan.trial, attempt=plan.attempt, kind=plan.kind,
                   description=plan.description, proposer=plan.proposer, best=plan.parent,
                   best_metric=plan.parent_metric, candidate=None, attempt_started_at=started)
        if plan.kind in ("baseline", "confirm") and not plan.replay_of:
            commit = self.ws.head()
        else:
            message = f"{plan.description}\n\nautoloop trial {plan.trial}.{plan.attempt} ({plan.proposer})"
            commit = self.ws.commit_candidate(message)
            fault_point("committed", plan.trial)
        self.ws.save_trial_ref(self.tag, plan.trial, plan.attempt, commit)
        diff_lines = self.ws.diff_lines(plan.parent, commit) if commit != plan.parent else 0
        self.enter("running", candidate=commit)

        runs = self.results_dir / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        nonce = secrets.token_hex(8)
        spec = TrialSpec(
            command=s.command_argv, cwd=self.ws.root,
            env=build_env(s.budget, plan.seed if plan.seed is not None else s.seed, runs / f"{plan.trial}-{plan.attempt}.result.json",
                          self.data_dir, s.device, nonce,
                          harness_path=harness_path(self.results_dir) if self.guard is not None else None)
                | self.trial_env,
            log_path=runs / f"{plan.trial}-{plan.attempt}.log",
            result_path=runs / f"{plan.trial}-{plan.attempt}.result.json",
            budget_s=s.budget, timeout_s=s.timeout_s, metric=s.metric, max_rss_gb=s.max_rss_gb,
            # Our own train.py reports through autoloop.evaluate; a val_bpb it printed by
            # itself is not a measurement. A foreign --command may only have stdout.
            require_result=s.command is None,
            log_cap_bytes=int(s.log_cap_mb * 2**20), isolate=s.isolate,
        )
        label = f"#{plan.trial}" + (f".{plan.attempt}" if plan.attempt > 1 else "")
        self.console.line(f"{label} {plan.kind}: {plan.description} [{commit[:7]}] training {format_duration(s.budget)}")
        outcome = self.executor.run(spec, on_progress=lambda line: self._on_progress(label, line),
                                    stop_event=self.stop_event, on_start=self._remember_children,
                                    on_job=self._remember_job)

        self.enter("judging")
        with self.deciding():
            after = self.check_inputs(plan.trial, plan.attempt)   # restored before the record is appended
            # After the integrity check (which keeps its own evidence of program.md): files the run
            # wrote into the repository are put back, so a kept commit leaves a clean tree.
            wrote = self.ws.undo_run_writes(self.quarantine_dir(plan.trial, plan.attempt) / "run")
            record = self.judge(plan, commit, outcome, started, diff_lines)
            if wrote:
                record.extra["run_wrote"] = wrote
                self.console.line(f"{label}: the run wrote {', '.join(wrote)} in the repository; put back (its "
                                  f"versions in {(self.quarantine_dir(plan.trial, plan.attempt) / 'run').relative_to(self.ws.root)})")
            if outcome.log_cut_bytes:
                record.extra["log_cut_bytes"] = outcome.log_cut_bytes
            record.extra.update(outcome.job)   # executor slurm: executor, cluster, job_id
            if before:
                record.extra["tampered_before_run"] = before.paths
            if after:
                self.invalidate(record, plan, after.paths)
            self.before_append(record, plan)
            self.ledger.append(record)
            fault_point("recorded", plan.trial)
            self.after_append(record)
        if record.extra.get("confirm") == "pending" and not self.stop_event.is_set():
            # The caller re-runs this commit at once (still checked out); the state stays
            # on this recorded attempt, so a kill now restores the best on --resume.
            self.console.line(self.verdict_line(label, record, plan.parent_metric))
            return record
        if record.best and self.ws.head() != record.best:
            self.ws.reset_to(record.best)
        self.enter("idle", candidate=None, child_pids=[], job=None, progress=None)
        self.console.line(self.verdict_line(label, record, plan.parent_metric))
        if after.unrestorable:
            raise LoopError(after.message)
        return record

    # Hooks for parallel workers (workers.py), which judge against a best other workers move:
    # the decision, the record and the move of the loop's branch happen under one lock.
    def deciding(self):
        return nullcontext()

    def before_append(self, record: LedgerRecord, plan: AttemptPlan) -> None:
        pass

    def after_append(self, record: LedgerRecord) -> None:
        pass

    def check_inputs(self, trial: int, attempt: int) -> Tampering:
        """Verify the measurement's protected inputs and restore what changed (integrity.py)."""
        if self.guard is None:
            return Tampering()
        found = self.guard.check(self.tamper_dir(trial, attempt))
        if found:
            where = self.tamper_dir(trial, attempt).relative_to(self.ws.root)
            self.console.line(f"#{trial}: {tampered_reason(found.paths)}; restored (changed versions in {where})")
        return found

    def invalidate(self, record: LedgerRecord, plan: AttemptPlan, paths: list[str]) -> None:
        """A protected input changed during the trial: its number cannot be trusted."""
        if record.metric is not None:
            record.extra["invalid_metric"] = record.metric
        record.status, record.crash, record.reason = "crash", "fundamental", tampered_reason(paths)
        record.metric = record.noise = record.confidence = None
        record.best, record.best_metric = (None, None) if plan.kind == "baseline" else (plan.parent, plan.parent_metric)
        record.extra.pop("confirm", None)
        record.extra["tampered"] = paths

    def _on_progress(self, label: str, line: str) -> None:
        """Live line on the terminal; the state file too (for `autoloop status`), at most every 2 s."""
        now = time.time()
        st = self.state
        self.console.status(live_line(
            label, "training", now - st.phase_started_at if st.phase_started_at else None, self.settings.budget,
            line, st.best_metric, st.deadline - now if st.deadline else None))
        if now - self._progress_saved_at >= 2.0:
            self._progress_saved_at = now
            self.state = self.state.model_copy(update={"progress": line})
            save_state(self.results_dir, self.state, self.state_name)

    def _remember_children(self, pids: list[tuple[int, float]]) -> None:
        self.state = self.state.model_copy(update={"child_pids": pids})
        save_state(self.results_dir, self.state, self.state_name)

    def _remember_job(self, job: dict) -> None:
        self.state = self.state.model_copy(update={"job": job})
        save_state(self.results_dir, self.state, self.state_name)

    def judge(self, plan: AttemptPlan, commit: str, outcome: TrialOutcome, started: float,
              diff_lines: int) -> LedgerRecord:
        s = self.settings
        verdict = classify(outcome)
        if outcome.killed_reason == "stopped" and self.stop_signal:
            verdict = verdict._replace(reason=f"interrupted ({self.stop_signal})")
        summary = outcome.summary or {}
        memory_mb = summary.get("peak_vram_mb") or outcome.peak_rss_mb
        result = outcome.result or {}
        record = LedgerRecord(
            trial=plan.trial, attempt=plan.attempt, kind=plan.kind, started_at=started, ended_at=time.time(),
            proposer=plan.proposer, parent=plan.parent, commit=commit, description=plan.description,
            status="crash", metric_name=s.metric, memory_gb=(memory_mb or 0) / 1024,
            training_seconds=summary.get("training_seconds"), total_seconds=summary.get("total_seconds"),
            wall_seconds=outcome.wall_seconds, exit_code=outcome.exit_code, signal=outcome.signal,
            diff_lines=diff_lines, seed=plan.seed if plan.seed is not None else s.seed, fingerprint=result.get("fingerprint") or self.fingerprint,
            log_path=self.log_rel(plan.trial, plan.attempt), outside_changes=plan.outside_changes,
            best=plan.parent, best_metric=plan.parent_metric,
            extra={**plan.extra,   # #18: the proposal's own fields (optuna trial, portfolio choice)
                   **{k: v for k, v in {"source": plan.source, "git_events": plan.git_events}.items() if v}},
        )
        if verdict.kind != "ok":
            record.crash = verdict.kind
            record.reason = verdict.reason
            if plan.kind == "baseline":
                record.best, record.best_metric = None, None
            return record
        record.metric = outcome.metric
        if isinstance(result.get("audit_bpb"), (int, float)):
            # Held-out figure: recorded for the morning report, never decided on, never
            # shown to a proposer (proposal_request strips it), never in results.tsv.
            record.extra["audit_bpb"] = result["audit_bpb"]
        if result.get("fingerprint") and self.fingerprint and result["fingerprint"] != self.fingerprint:
            record.crash, record.reason = "fundamental", (f"evaluated on other data (fingerprint "
                                                         f"{result['fingerprint']}, expected {self.fingerprint})")
            return record
        if plan.kind == "baseline":
            decision = decide(outcome.metric, None, s.direction, s.min_delta)
            record.status, record.reason = decision.status, decision.reason
            if decision.status == "keep":
                record.best, record.best_metric = commit, outcome.metric
            return record
        runs = [*(plan.prior_runs or []), outcome.metric]
        if plan.noise_sample:
            # A run of the best with another seed: it stays the best, its value becomes the
            # mean of its runs, and the spread of the runs is the noise estimate.
            k, n = plan.noise_sample
            sigma, method = noise_estimate(runs)
            record.status, record.reason = "keep", f"noise sample {k}/{n}"
            record.best, record.best_metric = commit, sum(runs) / len(runs)
            record.noise = sigma
            record.extra.update(noise_samples=runs, noise_method=method)
            return record
        noise = self.noise()
        j = judge_runs(runs, plan.parent_metric, s.direction, s.min_delta, noise=noise, z=s.noise_z,
                       rule=s.keep_rule, can_confirm=plan.can_confirm, sanity_bound=s.sanity_bound)
        record.noise, record.confidence, record.reason = noise, j.confidence, j.reason
        if len(runs) > 1:
            record.extra["runs"] = runs
        if j.status == "keep":
            record.status = "keep"
            record.best, record.best_metric = commit, j.mean
        elif j.status == "confirm":
            # Recorded as a discard of this run; the candidate stays checked out for the re-run.
            record.status = "discard"
            record.extra["confirm"] = "pending"
        else:
            record.status = "discard"
        return record

    def noise(self) -> float | None:
        """The latest noise estimate: the last noise sample that produced one."""
        for r in reversed(self.ledger.records()):
            if r.extra.get("noise_method") and r.noise is not None and r.status == "keep":
                return r.noise
        return None

    def runs_of(self, commit: str) -> list[float]:
        """Metrics of the judged runs of one commit (its first run and its re-runs)."""
        return [r.metric for r in self.ledger.records()
                if r.commit == commit and r.metric is not None and r.status in ("keep", "discard")]

    def measure_noise(self) -> None:
        """Run the best commit noise_runs more times with seeds seed+1.. as attempts of its trial."""
        s = self.settings
        best, best_metric = self.best()
        if not best or s.noise_runs <= 0:
            return
        records = self.ledger.records()
        owner = next((r for r in reversed(records) if r.commit == best and r.status == "keep"), None)
        if owner is None:
            return
        prior = self.runs_of(best)
        attempt = max(r.attempt for r in records if r.trial == owner.trial)
        for k in range(1, s.noise_runs + 1):
            if self.stop_event.is_set():
                return
            attempt += 1
            record = self.run_attempt(AttemptPlan(
                owner.trial, attempt, "confirm", f"noise sample {k}/{s.noise_runs}", "-", best,
                self.best()[1], [], seed=s.seed + len(prior), prior_runs=prior,
                noise_sample=(k, s.noise_runs)))
            if record.metric is None or record.status != "keep":
                continue
            prior = [*prior, record.metric]
        sigma = self.noise()
        if sigma is not None:
            self.console.line(f"noise: sigma {sigma:.6f} from {len(prior)} runs of {best[:7]}; best is their mean "
                              f"{self.best()[1]:.6f}")

    def verdict_line(self, label: str, record: LedgerRecord, best_before: float | None) -> str:
        """'#17 keep 1.0234 (-0.0041, 3.2σ) MATRIX_LR 0.04 -> 0.06' (report.format_verdict);
        the delta is against the best this attempt was judged against."""
        return format_verdict(label, record, best_before if record.status != "crash" else None)

    def record_skip(self, trial: int, attempt: int, proposer: str, reason: str, description: str = "-",
                    outside: list[str] | None = None, git_events: list[str] | None = None) -> None:
        best, best_metric = self.best()
        now = time.time()
        self.ledger.append(LedgerRecord(
            trial=trial, attempt=attempt, started_at=now, ended_at=now, proposer=proposer, parent=best,
            description=description, status="skip", reason=reason, metric_name=self.settings.metric,
            best=best, best_metric=best_metric, outside_changes=outside or [],
            extra={"git_events": git_events} if git_events else {},
        ))
        self.console.line(f"#{trial} skipped: {reason}")

    def confirm(self, record: LedgerRecord, best: str, best_metric: float | None) -> LedgerRecord:
        """A within-noise gain: run the same commit once more with a new seed and judge the mean."""
        if record.extra.get("confirm") != "pending":
            return record
        if self.stop_event.is_set():   # run_attempt already restored the best
            return record
        attempt = max(r.attempt for r in self.ledger.attempts_of(record.trial)) + 1
        return self.run_attempt(AttemptPlan(
            record.trial, attempt, "confirm", record.description, record.proposer, best, best_metric, [],
            record.extra.get("source"), seed=self.settings.seed + attempt - 1, prior_runs=[record.metric],
            can_confirm=False))

    def run_baseline(self) -> LedgerRecord:
        head = self.ws.head()
        trial = self.ledger.next_trial()
        record = self.run_attempt(AttemptPlan(trial, 1, "baseline", "baseline", "-", head, None, []))
        if record.status != "keep":
            raise LoopError(f"the baseline run of the unmodified {self.settings.target} failed "
                            f"({record.crash}: {record.reason}); see results/{record.log_path}")
        return record

    # -- signals -------------------------------------------------------------------------

    @contextmanager
    def graceful_signals(self):
        """SIGINT/SIGTERM stop the loop cleanly: the trial is ended and recorded, git restored."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self.stop_event.is_set():
                self.console.line(f"{name} again: still stopping, please wait")
                return
            self.stop_signal = name
            self.stop_event.set()
            self.console.line(f"{name}: stopping after cleaning up the current trial")

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


# ------------------------------------------------------------------------------ the loop


class Loop:
    """`autoloop run`: trials until time, trial count, proposer or a signal says stop."""

    def __init__(self, settings: Settings, workdir: Path, proposer: Proposer, console: Console | None = None):
        self.settings = settings
        self.session = Session(settings, workdir, console)
        self.console = self.session.console
        self.proposer = proposer

    def run(self) -> str:
        """Run until a stop condition; returns the stop reason (also stored in state.json)."""
        s, ss = self.settings, self.session
        check_isolation(s)
        ss.check_workspace()
        with workspace_lock(ss.results_dir), ss.graceful_signals():
            ss.repair_ledger()
            if s.resume:
                ss.recover()
            elif load_state(ss.results_dir).in_flight and load_state(ss.results_dir).tag == ss.tag:
                raise LoopError("the last run of this tag was interrupted; pass --resume to recover and continue")
            try:
                ss.ws.ensure_clean()
                if not s.resume:
                    ss.archive_other_tag()
                ss.ws.start_branch(ss.tag, resume=s.resume)
            except WorkspaceError as e:
                raise LoopError(str(e)) from None
            ss.prepare_data()
            started = time.time()
            deadline = started + s.hours * 3600 if s.hours else None
            ss.state = RunState(tag=ss.tag, pid=os.getpid(), run_started_at=started, deadline=deadline)
            save_state(ss.results_dir, ss.state)
            self.console.line(f"autoloop on {ss.ws.branch_name(ss.tag)}: proposer {self.proposer.name}, budget "
                              f"{format_duration(s.budget)}, timeout {format_duration(s.timeout_s)}"
                              + (f", until {time.strftime('%H:%M', time.localtime(deadline))}" if deadline else ""))
            reason = self._loop(deadline)
            ss.state = set_phase(ss.results_dir, ss.state, "stopped", stop_reason=reason, stopped_at=time.time())
            best, best_metric = ss.best()
            self.console.line(f"stopped: {reason}. best {format_metric(best_metric)} at {best[:7] if best else '-'}")
            return reason

    def _stop_reason(self, trials_started: int, failures: int, deadline: float | None) -> str | None:
        s, ss = self.settings, self.session
        if ss.stop_event.is_set():
            return f"stopped by {ss.stop_signal or 'request'}"
        if s.max_trials is not None and trials_started >= s.max_trials:
            return f"reached --max-trials {s.max_trials}"
        # An agent has a limit of its own (its failures are slow and cost money).
        limit, flag = ((s.max_agent_failures, "--max-agent-failures") if self.proposer.name == "agent"
                       else (s.max_proposer_failures, "--max-proposer-failures"))
        if failures >= limit:
            last = ss.ledger.last(1)
            why = f"; last: {last[0]['reason']}" if last and last[0].get("reason") else ""
            return f"{self.proposer.name} failed {failures} times in a row ({flag} {limit}){why}"
        low_disk = ss.low_disk()
        if low_disk:
            return low_disk
        if deadline is not None and time.time() + self._expected_trial_seconds() > deadline:
            return "time is up: the next trial could not finish before the --hours deadline"
        return None

    def _expected_trial_seconds(self) -> float:
        walls = [r.ended_at - r.started_at for r in self.session.ledger.records()[-10:] if r.status != "skip"]
        if walls:
            return statistics.median(walls)
        return self.settings.budget + 30

    def _loop(self, deadline: float | None) -> str:
        ss = self.session
        low_disk = ss.low_disk()
        if low_disk:
            return low_disk
        if ss.baseline_record() is None:
            if deadline is not None and time.time() + self._expected_trial_seconds() > deadline:
                return "time is up: not even the baseline fits before the --hours deadline"
            ss.run_baseline()
            ss.measure_noise()
        elif self.settings.remeasure:
            ss.measure_noise()
        trials_started, failures = 0, 0
        while True:
            reason = self._stop_reason(trials_started, failures, deadline)
            if reason:
                return reason
            trial = ss.ledger.next_trial()
            outcome = self._one_trial(trial)
            if outcome == "exhausted":
                return f"proposer '{self.proposer.name}' has no more ideas"
            if outcome == "failed":
                failures += 1
            else:
                failures = 0
                trials_started += 1

    def _propose(self, request: ProposalRequest) -> tuple[Proposal | None, str | None, list[str], list[str]]:
        """(proposal, failure reason, files reverted, git events); the edit is left in the work tree."""
        ss = self.session
        base = ss.ws.head()
        before = git_guard.snapshot(ss.ws, ss.tag)
        request.process_token = secrets.token_hex(16)
        ss.enter("proposing", trial=request.trial, attempt=request.attempt, kind="fix" if request.fix else "candidate",
                 description=None, proposer=self.proposer.name, best=request.best_commit,
                 best_metric=request.best_metric, candidate=None, attempt_started_at=time.time(),
                 child_token=request.process_token)
        try:
            proposal, failure = self.proposer.propose(request), None
        except ProposalFailed as e:
            proposal, failure = None, str(e)
        else:
            fault_point("proposed", request.trial)
        # Git first: a proposer that committed, switched branch or reset must not have the
        # scope guard (or a reset) act on some other branch than the loop's.
        guard = self._reconcile_git(request, base, before)
        outside = ss.ws.scope_guard(ss.quarantine_dir(request.trial, request.attempt), base=base)
        if outside:
            self.console.line(f"#{request.trial}: reverted changes outside {self.settings.target}: {', '.join(outside)}")
        if proposal is None or guard.target_deleted:
            ss.ws.reset_to(base)
            if proposal is not None:   # nothing to run: recorded as a skip, like a failed proposal
                failure = f"{self.proposer.name} deleted {self.settings.target}"
            return None, failure, outside, guard.events
        if not ss.ws.target_changed():
            return None, f"proposal made no change to {self.settings.target}", outside, guard.events
        if proposal.derived and guard.commit_message:
            # The agent said what it did in its commits rather than in the description file.
            proposal.description = (f"{request.fix.description} (fix: {guard.commit_message})" if request.fix
                                    else guard.commit_message)
        return proposal, None, outside, guard.events

    def _reconcile_git(self, request: ProposalRequest, base: str,
                       before: git_guard.RefSnapshot) -> git_guard.Reconciled:
        ss = self.session
        try:
            guard = git_guard.reconcile(ss.ws, ss.tag, base, request.trial, request.attempt, before)
        except WorkspaceError as e:
            raise LoopError(str(e)) from None
        if guard.events:
            self.console.line(f"#{request.trial}: git: {'; '.join(guard.events)}")
        return guard

    def _one_trial(self, trial: int) -> str:
        """Propose and run one trial with its fix attempts: 'ran', 'failed' or 'exhausted'."""
        ss = self.session
        best, best_metric = ss.best()
        proposal, failure, outside, events = self._propose(ss.proposal_request(trial, 1))
        if proposal is None:
            ss.enter("idle")
            if failure is None:
                return "exhausted"
            ss.record_skip(trial, 1, self.proposer.name, failure, outside=outside, git_events=events)
            return "failed"
        record = ss.run_attempt(AttemptPlan(trial, 1, "candidate", proposal.description, self.proposer.name,
                                            best, best_metric, outside, proposal.source, git_events=events,
                                            extra=proposal.extra))   # #18: the proposal's own fields
        attempt = 1
        record = self._confirm(record, best, best_metric)
        while (record.kind != "confirm" and record.crash == "trivial" and self.proposer.can_fix and attempt <= self.settings.max_fix_attempts
               and not ss.stop_event.is_set()):
            attempt += 1
            record = self._fix(trial, attempt, record, best, best_metric)
            if record is None:
                break
        return "ran"

    def _fix(self, trial: int, attempt: int, failed: LedgerRecord, best: str, best_metric: float | None):
        """Hand the broken edit back to the proposer with the evidence; run the fix."""
        ss = self.session
        broken = ss.ws.file_at(failed.commit, self.settings.target)
        if broken is not None:
            ss.ws.target_path.write_text(broken)
        log_tail = ""
        if failed.log_path and (ss.results_dir / failed.log_path).exists():
            log_tail = "\n".join((ss.results_dir / failed.log_path).read_text(errors="replace").splitlines()[-60:])
        fix = FixContext(crash=failed.crash or "trivial", reason=failed.reason, log_tail=log_tail,
                         description=failed.description)
        proposal, failure, outside, events = self._propose(ss.proposal_request(trial, attempt, fix))
        if proposal is not None and broken is not None and ss.ws.target_path.read_text() == broken:
            proposal, failure = None, "the fix made no change to the broken edit"
        if proposal is None:
            ss.ws.reset_to(best)
            ss.enter("idle")
            if failure:
                ss.record_skip(trial, attempt, self.proposer.name, f"fix failed: {failure}", failed.description, outside,
                               git_events=events)
            return None
        record = ss.run_attempt(AttemptPlan(trial, attempt, "fix", proposal.description, self.proposer.name,
                                            best, best_metric, outside, proposal.source, git_events=events,
                                            extra=proposal.extra))   # #18: the proposal's own fields
        return self._confirm(record, best, best_metric)

    def _confirm(self, record: LedgerRecord, best: str, best_metric: float | None) -> LedgerRecord:
        return self.session.confirm(record, best, best_metric)


# ------------------------------------------------------------------------------ one trial


def run_single_trial(settings: Settings, workdir: Path, description: str, console: Console | None = None) -> LedgerRecord:
    """`autoloop trial -m DESC`: judge the current edit of the target as one trial.

    For an agent that drives itself: it edits the target, calls this, reads the verdict.
    The first call on a branch runs the baseline of the unmodified target first.
    """
    check_isolation(settings)
    ss = Session(settings, workdir, console)
    ss.check_workspace()
    with workspace_lock(ss.results_dir), ss.graceful_signals():
        ss.repair_ledger()
        ss.recover()
        current = ss.ws.current_branch() or ""
        if current.startswith("autoloop/"):
            ss.tag = current[len("autoloop/"):]
        elif ss.ws.branch_exists(ss.tag):
            raise LoopError(f"branch {ss.ws.branch_name(ss.tag)} exists but {current or 'a detached HEAD'} is checked out; "
                            f"switch to it or pass --tag NAME")
        else:
            ss.ws.start_branch(ss.tag, resume=False)   # a new branch at HEAD keeps the edit
        events: list[str] = []
        best = ss.best()[0]
        if best and load_state(ss.results_dir).tag == ss.tag and ss.ws.head() != best:
            # An agent that committed its edit (or amended the best, or reset): the net
            # change on top of the best is the candidate, the branch goes back to the best.
            try:
                events = git_guard.reconcile(ss.ws, ss.tag, best, ss.ledger.next_trial(), 1).events
            except WorkspaceError as e:
                raise LoopError(str(e)) from None
            if events:
                ss.console.line(f"git: {'; '.join(events)}")
        base = ss.ws.head()
        outside = ss.ws.scope_guard(ss.quarantine_dir(ss.ledger.next_trial(), 1), base=base)
        if outside:
            ss.console.line(f"reverted changes outside {settings.target}: {', '.join(outside)}")
        ss.prepare_data(reuse_snapshot=True)   # the agent worked since the last call: check against that
        low_disk = ss.low_disk()
        if low_disk:
            raise LoopError(low_disk)
        ss.state = RunState(tag=ss.tag, pid=os.getpid(), run_started_at=time.time())
        save_state(ss.results_dir, ss.state)
        if ss.baseline_record() is None:
            edit = ss.ws.target_path.read_text() if ss.ws.target_changed() else None
            if edit is not None:
                ss.ws.reset_to(base)
            ss.run_baseline()
            ss.measure_noise()
            if edit is not None:
                ss.ws.target_path.write_text(edit)
        if not ss.ws.target_changed():
            raise LoopError(f"{settings.target} has no change to try; edit it first")
        best, best_metric = ss.best()
        record = ss.run_attempt(AttemptPlan(ss.ledger.next_trial(), 1, "candidate", description, "self",
                                            best, best_metric, outside, git_events=events))
        return ss.confirm(record, best, best_metric)
