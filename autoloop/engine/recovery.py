"""Finishing the attempts a kill interrupted, so that the night can go on as if it had not been.

Crash safety rests on two files and one ordering (docs/architecture.md, "Crash safety"):
the state file says which attempt is in flight and in what phase, written *before* each
phase starts; the ledger is the commit point (an attempt has happened once its record is
appended, and the record carries the best after its decision); git follows the ledger (the
branch is moved to the record's best, and only then is the state set back to idle).

So whatever moment a ``kill -9`` lands on, the next start finds, for each state file in
flight (the single loop's ``state.json``, each worker's ``state-w<k>.json``):

* the attempt's record in the ledger: it happened; git is made to agree with it;
* or no record: the attempt is recorded as ``crash``/``fundamental``, reason
  ``interrupted (orchestrator stopped during <phase>)``, after its candidate is saved
  under its trial ref (committing what the proposer left in the work tree if need be).

Before that, a Slurm job of the attempt still queued or running is re-attached to (waited
for, its result then taken with the nonce check: engine/orphan.py), everything else the
interrupted attempt left running is ended (its processes, by pid and token; a job that
cannot be waited for), its capped log is put together, the measurement's inputs are
restored if it changed them, and a git ``index.lock`` it left behind is removed. Nothing
tried is lost; the branch always ends at the best commit.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import cast

import psutil

from autoloop.core.errors import NightError
from autoloop.core.keep import Facts, decide, tampered_reason
from autoloop.core.layout import Layout
from autoloop.engine.night import Night
from autoloop.engine.orphan import reattach, record_finished_job
from autoloop.execution.executors import cancel_job
from autoloop.execution.integrity import Tampering, recover_inputs
from autoloop.execution.procs import end_leftovers
from autoloop.observe.console import Console
from autoloop.repo import reconcile
from autoloop.repo.workspace import Workspace
from autoloop.repo.worktrees import ahead_workspace, ensure_ahead_worktree, ensure_worktree, worker_workspace
from autoloop.store.ledger import AttemptKind, Draft, Extra
from autoloop.store.runlog import finish_log
from autoloop.store.state import RunState, StateFile, load_state


def interrupted(layout: Layout) -> list[tuple[int | None, RunState]]:
    """(worker or None, state) of every state file with an attempt in flight."""
    found: list[tuple[int | None, RunState]] = [(None, load_state(layout.root))]
    found += [(k, load_state(layout.root, path.name)) for k, path in layout.worker_states()]
    return [(k, state) for k, state in found if state.in_flight]


def interrupted_lookahead(layout: Layout) -> list[tuple[int | None, RunState]]:
    """(worker or None, state) of every look-ahead proposal a kill interrupted."""
    found = [(k, load_state(layout.root, path.name)) for k, path in layout.ahead_states()]
    return [(k, state) for k, state in found if state.in_flight]


def recover_night(night: Night) -> None:
    """Finish every interrupted attempt: the single loop's, then each worker's (in its own
    worktree, made again if a kill left it half made), then each look-ahead proposal's."""
    found = interrupted(night.layout)
    for worker, state in found:
        if worker is None:
            finish_attempt(night, night.ws, StateFile(night.layout.root, state=state), None)
            continue
        ensure_worktree(night.ws, worker, night.tag, state.best or night.ws.head())
        ws = worker_workspace(night.ws.root, worker, night.tag, night.settings.target, night.layout.root)
        try:
            finish_attempt(night, ws, StateFile(night.layout.root, Layout.worker_state_name(worker), state), worker)
        finally:
            ws.close()
        night.layout.state(Layout.worker_state_name(worker)).unlink(missing_ok=True)
    ahead = interrupted_lookahead(night.layout)
    for worker, state in ahead:
        _finish_lookahead(night, worker, state)
    if found or ahead:
        # We hold the workspace lock, so no git command of ours is running: a lock file in
        # the main checkout was left by a git process killed with us (a branch move).
        _remove_index_lock(night.ws)


def _finish_lookahead(night: Night, worker: int | None, state: RunState) -> None:
    """A look-ahead proposal in flight at the kill: one that got as far as being prepared
    (results/prepared/<trial>.json) is left for the scheduler to run; any other is finished
    like an interrupted proposal, in the look-ahead's worktree."""
    name = Layout.ahead_state_name(worker)
    if state.trial is not None and night.layout.prepared(state.trial).exists():
        night.layout.state(name).unlink(missing_ok=True)
        return
    ensure_ahead_worktree(night.ws, worker, night.tag, state.best or night.ws.head())
    ws = ahead_workspace(night.ws.root, worker, night.tag, night.settings.target, night.layout.root)
    try:
        finish_attempt(night, ws, StateFile(night.layout.root, name, state), worker)
    finally:
        ws.close()
    night.layout.state(name).unlink(missing_ok=True)


def finish_attempt(night: Night, ws: Workspace, state_file: StateFile, worker: int | None) -> None:
    """Bring one interrupted attempt to a clean end (see the module docstring)."""
    state = state_file.state
    if state.tag and state.tag != night.tag:
        raise NightError(f"an attempt of tag '{state.tag}' was interrupted; resume it with "
                         f"--resume --tag {state.tag} first")
    # A kill between the ledger append and the results.tsv rewrite leaves the table a row
    # short; the ledger is the truth, the table is rebuilt from it.
    night.ledger.write_tsv()
    tampered = _end_what_it_left(night, state)
    _remove_index_lock(ws)
    existing = [r for r in night.arbiter.records() if r.trial == state.trial and r.attempt == state.attempt]
    if existing:
        best = existing[-1].best or state.best or ws.head()
        night.console.line(f"recovery: trial {state.trial}.{state.attempt} was recorded ({existing[-1].status}); "
                           f"restoring the branch to {best[:7]}")
    else:
        best = (record_finished_job(night, state, tampered, worker)
                or _record_interrupted(night, ws, state, tampered, worker) or state.best or ws.head())
    _set_aside_untracked(night, ws, state)
    ws.reset_to(best)
    state_file.enter("idle", candidate=None, child_pids=[], job=None, progress=None)


def _attempt_of(state: RunState) -> tuple[int, int]:
    """(trial, attempt) of the attempt in flight. Every phase in flight is entered with both
    (candidate.prepare, AttemptRunner.run), so a state without them was not written by us."""
    if state.trial is None:
        raise NightError("a state file says an attempt is in flight but names no trial; "
                         f"it was not written by autoloop (phase {state.phase})")
    return state.trial, state.attempt or 1


def _end_what_it_left(night: Night, state: RunState) -> Tampering:
    """Wait for its job (or end it), end its processes, mend its log, restore the inputs it changed."""
    console, layout = night.console, night.layout
    # A job of the interrupted trial still queued or running: waited for while it can give the
    # attempt's result, cancelled otherwise (or on Ctrl-C during the wait).
    cancelled = None if reattach(night, state) else cancel_job(state.job)
    if cancelled:
        console.line(f"recovery: {cancelled}")
    ended = end_leftovers(state.child_pids, token=state.child_token, results_dir=layout.root)
    if ended:
        console.line(f"recovery: ended {ended} process(es) left by the interrupted trial")
    if state.trial is not None and state.attempt is not None:
        try:  # a capped log left in pieces by the kill
            finish_log(layout.log(state.trial, state.attempt))
        except OSError as e:
            console.line(f"recovery: the log of the interrupted trial stays in pieces ({e})")
    # Killed after the trial but before its check: put the measurement's inputs back first.
    tampered = recover_inputs(layout.root, layout.tampered(*_attempt_of(state)))
    if tampered:
        console.line(f"recovery: {tampered_reason(tampered.paths)} (by the interrupted attempt); restored")
    if tampered.unrestorable:
        raise NightError(tampered.message)
    return tampered


def _set_aside_untracked(night: Night, ws: Workspace, state: RunState) -> None:
    """Untracked files in the work tree (the interrupted run's, or yours, made since the
    kill) are moved to the attempt's quarantine, never deleted by the reset that follows."""
    if state.trial is None or state.attempt is None:
        return
    dest = night.layout.quarantine(state.trial, state.attempt) / "recovery"
    moved = ws.set_aside_untracked(dest)
    if moved:
        shown = ", ".join(moved[:5]) + (f" and {len(moved) - 5} more" if len(moved) > 5 else "")
        where = dest.relative_to(night.ws.root) if dest.is_relative_to(night.ws.root) else dest
        night.console.line(f"recovery: untracked {shown} set aside in {where}/ (not deleted)")


def remove_stale_index_lock(ws: Workspace, console: Console) -> None:
    """A git ``index.lock`` in the main checkout that no running git holds: left by a git
    killed with an earlier orchestrator when no attempt was in flight (a branch move at a
    stop), it made every later start fail ("cannot check out": benchmarks/chaos.py found
    it). git holds no lock on the file, so "no git process runs in this repository" is the
    test; one that does (the person's own) keeps its lock."""
    index_lock = Path(ws.repo.git_dir) / "index.lock"
    if not index_lock.exists():
        return
    root, me = str(ws.root.resolve()), os.getpid()
    for proc in psutil.process_iter(["name", "ppid"]):
        with contextlib.suppress(psutil.Error):
            # Our own GitPython helpers (git cat-file, children of this process) take no lock.
            if proc.info["name"] == "git" and proc.info["ppid"] != me and proc.cwd().startswith(root):
                return
    index_lock.unlink(missing_ok=True)
    console.line("recovery: removed a stale .git/index.lock (no git process holds it)")


def _remove_index_lock(ws: Workspace) -> None:
    index_lock = Path(ws.repo.git_dir) / "index.lock"   # a linked worktree's own git dir too
    index_lock.unlink(missing_ok=True)


def _candidate(night: Night, ws: Workspace, state: RunState) -> tuple[str | None, list[str]]:
    """The interrupted attempt's candidate commit, made from the work tree if the kill came
    before the commit; and what the proposer had done to git meanwhile."""
    best = state.best or ws.head()
    trial, attempt = _attempt_of(state)
    candidate, events, deleted = state.candidate, [], False
    if state.phase == "proposing" and state.best:
        # The proposer may have committed, switched branch or reset, or moved tags and
        # branches, before the kill: the refs snapshot persisted before the call puts them back.
        saved_refs = night.layout.ref_snapshot(trial, attempt)
        outcome = reconcile.reconcile(ws, night.tag, best, trial, attempt, reconcile.RefSnapshot.load(saved_refs))
        saved_refs.unlink(missing_ok=True)
        events, deleted = outcome.events, outcome.target_deleted
        if events:
            night.console.line(f"recovery: git: {'; '.join(events)}")
    head = ws.head()
    if candidate is None and head != best and ws.is_ancestor(best, head):
        candidate = head   # committed, killed before the state said so
    if candidate is None and state.kind not in ("baseline", "confirm", "verify"):
        ws.revert_out_of_scope(night.layout.quarantine(trial, attempt), base=best)
        if ws.target_changed() and not deleted:
            candidate = ws.commit_candidate(f"{state.description or 'interrupted candidate'}"
                                            f"\n\nautoloop trial {state.trial}.{state.attempt} (interrupted)")
    return candidate, events


def _record_interrupted(night: Night, ws: Workspace, state: RunState, tampered: Tampering,
                        worker: int | None) -> str | None:
    """Record the attempt as interrupted (its candidate kept under its trial ref); the best
    after the record."""
    candidate, events = _candidate(night, ws, state)
    trial, attempt = _attempt_of(state)
    ref = ws.save_trial_ref(night.tag, trial, attempt, candidate) if candidate else None
    reason = (f"interrupted (orchestrator stopped during {state.phase})"
              + (f"; {tampered_reason(tampered.paths)}" if tampered else ""))
    decision = decide(Facts(kind=state.kind or "candidate", commit=candidate, crash=("fundamental", reason),
                            parent=(state.best, state.best_metric), current=night.arbiter.best()))
    now = time.time()
    facts: Extra = {**({"tampered": tampered.paths} if tampered else {}), **({"git_events": events} if events else {})}
    record = night.arbiter.record(Draft(
        trial=trial, attempt=state.attempt or 1, kind=cast(AttemptKind, state.kind or "candidate"),
        started_at=state.attempt_started_at or now, ended_at=now, proposer=state.proposer or "-",
        parent=state.best, commit=candidate, description=state.description or "interrupted",
        metric_name=night.settings.metric, seed=night.settings.seed,
        log_path=night.layout.log_rel(trial, attempt), fidelity="scout" if state.kind == "scout" else "full",
        extra=facts,
    ), decision, worker)
    night.console.line(f"recovery: trial {state.trial}.{state.attempt} was interrupted during {state.phase}; "
                       f"recorded as crash, candidate kept at {ref or '(none)'}")
    return record.best
