"""Preparing a candidate: the proposer's one change, made safe to run.

``prepare`` asks the proposer for one edit of the target in the slot's work tree, then
puts git back the way the rest of the trial relies on (``git_guard``: the agent's commits,
branch switches and resets undone, its work saved under refs), reverts and quarantines
every change outside the target (the scope guard), and screens what is left
(``screen``: the one place a prepared change is checked before it may run). What comes out
is a :class:`~autoloop.attempt.Candidate`, a :class:`Skipped` (recorded as a ``skip``), or
None when the proposer has no more ideas.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from autoloop import git_guard
from autoloop.attempt import Candidate, Slot
from autoloop.layout import Layout
from autoloop.ledger import LedgerRecord
from autoloop.proposers.base import FixContext, ProposalFailed, Proposer, ProposalRequest
from autoloop.state import fault_point
from autoloop.workspace import Workspace

PROGRAM_FILE = "program.md"
LEDGER_TAIL_FOR_PROPOSER = 20
FIX_LOG_LINES = 60


@dataclass(frozen=True)
class Skipped:
    """A proposal that failed before anything could run: why, and what the guards found."""

    reason: str
    outside_changes: tuple[str, ...] = ()
    git_events: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)   # the proposal's own facts, when it made one (#18)


def strip_audit(record: dict) -> dict:
    """A ledger record without any held-out audit figure (top level or nested, e.g. in
    extra): what a proposer may see."""
    return {k: strip_audit(v) if isinstance(v, dict) else v
            for k, v in record.items() if not str(k).startswith("audit")}


def proposal_request(settings, ws: Workspace, layout: Layout, records: list[LedgerRecord], trial: int, attempt: int,
                     best: tuple[str | None, float | None], fix: FixContext | None = None) -> ProposalRequest:
    """What the proposer is told: program.md, the best it builds on, the recent results
    (audit figures stripped), and for a fix request the crash and the end of its log."""
    program = ws.root / PROGRAM_FILE
    tail = [strip_audit(r.model_dump(mode="json")) for r in records[-LEDGER_TAIL_FOR_PROPOSER:]]
    return ProposalRequest(
        workspace=ws.root, target=settings.target, program_text=program.read_text() if program.exists() else "",
        metric_name=settings.metric, direction=settings.direction, best_metric=best[1], best_commit=best[0],
        trial=trial, attempt=attempt, seed=settings.seed, ledger_tail=tail, fix=fix, results_dir=layout.root)


def fix_context(ws: Workspace, layout: Layout, failed: LedgerRecord) -> tuple[FixContext, str | None]:
    """The fix request for a trivially crashed attempt, and its broken target (``prepare``
    puts it back in the work tree for the proposer to repair)."""
    broken = ws.file_at(failed.commit, ws.target) if failed.commit else None
    log_tail = ""
    if failed.log_path and (layout.root / failed.log_path).exists():
        log_tail = "\n".join((layout.root / failed.log_path).read_text(errors="replace").splitlines()[-FIX_LOG_LINES:])
    return FixContext(crash=failed.crash or "trivial", reason=failed.reason, log_tail=log_tail,
                      description=failed.description), broken


def prepare(night, slot: Slot, proposer: Proposer, request: ProposalRequest,
            broken: str | None = None) -> Candidate | Skipped | None:
    """One proposal, guarded and screened (see the module docstring). The state file says
    ``proposing`` first, with the token every process of the proposer gets, so a kill while
    it runs is recovered. ``broken``: the crashed edit a fix request hands back."""
    ws, console = slot.ws, slot.console or night.console
    base = ws.head()
    before = git_guard.snapshot(ws, night.tag)
    saved_refs = night.layout.ref_snapshot(request.trial, request.attempt)
    before.save(saved_refs)   # before the state says proposing: recovery finds it for any kill during the call
    request.process_token = secrets.token_hex(16)
    request.stop_event = night.stop.event
    request.on_start = lambda pids: slot.state.update(child_pids=pids)
    slot.state.enter("proposing", trial=request.trial, attempt=request.attempt,
                     kind="fix" if request.fix else "candidate", description=None, proposer=proposer.name,
                     best=request.best_commit, best_metric=request.best_metric, candidate=None,
                     attempt_started_at=time.time(), child_token=request.process_token)
    if broken is not None:   # after the state says so: a kill now is recovered like any proposal
        ws.target_path.write_text(broken)
    asked = time.time()
    try:
        proposal, failure = proposer.propose(request), None
    except ProposalFailed as e:
        proposal, failure = None, str(e)
    else:
        fault_point("proposed", request.trial)
    # The proposer's time, a fact of its record: `autoloop status` sums it per trial (#16).
    timing = {"propose_seconds": round(time.time() - asked, 3)}
    # Git first: a proposer that committed, switched branch or reset must not have the
    # scope guard (or a reset) act on some other branch than the loop's.
    guard = git_guard.reconcile(ws, night.tag, base, request.trial, request.attempt, before)
    saved_refs.unlink(missing_ok=True)
    if guard.events:
        console.line(f"#{request.trial}: git: {'; '.join(guard.events)}")
    outside = tuple(ws.scope_guard(night.layout.quarantine(request.trial, request.attempt), base=base))
    if outside:
        console.line(f"#{request.trial}: reverted changes outside {ws.target}: {', '.join(outside)}")
    events = tuple(guard.events)
    if proposal is None or guard.target_deleted:
        ws.reset_to(base)
        if proposal is not None:   # nothing to run: recorded as a skip, like a failed proposal
            failure = f"{proposer.name} deleted {ws.target}"
        extra = {**(proposal.extra if proposal is not None else {}), **timing}
        return Skipped(failure, outside, events, extra) if failure is not None else None
    refused = screen(ws, broken)
    if refused:   # the proposal's facts stay with its record (a portfolio's choice: whose it was)
        return Skipped(refused, outside, events, {**proposal.extra, **timing})
    description = proposal.description
    if proposal.derived and guard.commit_message:
        # The agent said what it did in its commits rather than in the description file.
        description = (f"{request.fix.description} (fix: {guard.commit_message})" if request.fix
                       else guard.commit_message)
    return Candidate(None, request.best_commit, request.best_metric, description, proposer.name, proposal.source,
                     outside, events, extra={**proposal.extra, **timing})


def screen(ws: Workspace, broken: str | None = None) -> str | None:
    """Why a prepared edit must not run (a skip), or None: the one check between proposing
    and running. Today: it changed nothing, or a fix left the broken edit as it was."""
    if not ws.target_changed():
        return f"proposal made no change to {ws.target}"
    if broken is not None and ws.target_path.read_text() == broken:
        return "the fix made no change to the broken edit"
    return None
