"""Preparing a candidate: the proposer's one change, made safe to run.

``prepare`` asks the proposer for one edit of the target in the slot's work tree, then
puts git back the way the rest of the trial relies on (``reconcile``: the agent's commits,
branch switches and resets undone, its work saved under refs), reverts and quarantines
every change outside the target (the scope check), and screens what is left
(``screen``: the one place a prepared change is checked before it may run; the duplicate
gate is there). What comes out
is a :class:`Candidate`, a :class:`Skipped` (recorded as a ``skip``), or
None when the proposer has no more ideas. :class:`Claims` tells a proposer what the other
slots are proposing at the same moment.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from git import BadName, BadObject

from autoloop.config.settings import Settings
from autoloop.core import duplicate_gate
from autoloop.core.errors import NightError
from autoloop.core.layout import Layout
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.execution.devices import trial_device_kind
from autoloop.observe.console import Console, Prefixed
from autoloop.proposers.base import FixContext, Proposal, ProposalFailed, ProposalRequest, Proposer
from autoloop.repo import reconcile
from autoloop.repo.workspace import Workspace
from autoloop.store import person_notes, queries
from autoloop.store.ledger import LedgerRecord, trial_label
from autoloop.store.state import fault_point

PROGRAM_FILE = "program.md"
LEDGER_TAIL_FOR_PROPOSER = 20
FIX_LOG_LINES = 60


# Who holds a claim: a slot (its worker number, None for the single loop) or a slot's
# look-ahead (lookahead.key: "ahead-<worker>"), which proposes beside the slot's trial.
Claimant = int | str | None


class Claims:
    """What each slot is trying right now, for the proposer's memory (the mutator then never
    draws the same move twice at once); and one proposal at a time for the proposers that
    are quick and read one shared memory (the queue, the mutator, a portfolio of those).
    Agents work in parallel, alone or in a portfolio: that is the point."""

    def __init__(self, one_at_a_time: bool):
        self._lock = threading.Lock()
        self._serial = threading.Lock() if one_at_a_time else None
        self._claims: dict[Claimant, dict[str, Any]] = {}

    @contextmanager
    def proposing(self, worker: Claimant) -> Iterator[list[dict[str, Any]]]:
        with self._serial or nullcontext():
            with self._lock:
                others = [dict(d) for w, d in self._claims.items() if w != worker]
            yield others

    def claim(self, worker: Claimant, what: dict[str, Any]) -> None:
        with self._lock:
            self._claims[worker] = what

    def release(self, worker: Claimant) -> None:
        with self._lock:
            self._claims.pop(worker, None)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """What an attempt runs: a change on top of ``parent`` (the best it was built on), with
    what it tries and where it came from. ``commit`` None: the edit is in the slot's work
    tree and is committed as the attempt's first step. ``extra`` goes into the record."""

    commit: str | None
    parent: str | None
    parent_metric: float | None
    description: str
    proposer: str
    source: str | None = None
    outside_changes: tuple[str, ...] = ()
    git_events: tuple[str, ...] = ()
    replay_of: str | None = None          # the commit whose change this is, replayed on a new best
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Skipped:
    """A proposal that failed before anything could run: why, and what the checks found."""

    reason: str
    outside_changes: tuple[str, ...] = ()
    git_events: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)   # the proposal's own facts (whose, what it cost)
    duplicate_of: str | None = None             # the earlier attempt it repeats (the duplicate gate)
    description: str | None = None              # what the refused proposal said it does (a duplicate's)


@dataclass(frozen=True)
class Refusal:
    """Why ``screen`` refuses a prepared edit; ``duplicate_of``: the attempt it repeats."""

    reason: str
    duplicate_of: str | None = None
    earlier_night: str | None = None   # the duplicate's night, when it was an earlier one


def strip_audit(record: dict[str, Any]) -> dict[str, Any]:
    """A ledger record without any held-out audit figure (top level or nested, e.g. in
    extra): what a proposer may see."""
    return {k: strip_audit(v) if isinstance(v, dict) else v
            for k, v in record.items() if not str(k).startswith("audit")}


def proposal_request(settings: Settings, ws: Workspace, layout: Layout, records: list[LedgerRecord], trial: int,
                     attempt: int, parent: tuple[str | None, float | None],
                     fix: FixContext | None = None, env: Mapping[str, str] | None = None) -> ProposalRequest:
    """What the proposer is told: program.md, the best it builds on (``parent``), the whole ledger and
    the recent results (audit figures stripped), the person's notes in force (read anew
    for every proposal: a note written a minute ago reaches the next one), and for a fix
    request the crash and the end of its log."""
    program = ws.root / PROGRAM_FILE
    # autoloop verify's runs are not the search: the proposer sees the night's attempts.
    history = [strip_audit(r.model_dump(mode="json")) for r in queries.of_night(records)]
    return ProposalRequest(
        workspace=ws.root, target=settings.target, program_text=program.read_text() if program.exists() else "",
        metric_name=settings.metric, direction=settings.direction, parent_metric=parent[1], parent=parent[0],
        trial=trial, attempt=attempt, seed=settings.seed, ledger_tail=history[-LEDGER_TAIL_FOR_PROPOSER:], fix=fix,
        results_dir=layout.root, history=[LedgerRecord.model_validate(r) for r in history],
        digest_bytes=int(settings.digest_kb * 1024), notes=person_notes.active_notes(layout.root),
        guards=list(settings.guards), device=trial_device_kind(settings, env))


def fix_context(ws: Workspace, layout: Layout, failed: LedgerRecord) -> tuple[FixContext, str | None]:
    """The fix request for a trivially crashed attempt, and its broken target (``prepare``
    puts it back in the work tree for the proposer to repair)."""
    broken = ws.file_at(failed.commit, ws.target) if failed.commit else None
    log_tail = ""
    if failed.log_path and (layout.root / failed.log_path).exists():
        log_tail = "\n".join((layout.root / failed.log_path).read_text(errors="replace").splitlines()[-FIX_LOG_LINES:])
    return FixContext(crash=failed.crash or "trivial", reason=failed.reason, log_tail=log_tail,
                      description=failed.description), broken


def prepare(night: Night, slot: Slot, proposer: Proposer, request: ProposalRequest,
            broken: str | None = None) -> Candidate | Skipped | None:
    """One proposal, guarded and screened (see the module docstring). The state file says
    ``proposing`` first, with the token every process of the proposer gets, so a kill while
    it runs is recovered. ``broken``: the crashed edit a fix request hands back."""
    ws = slot.ws
    parent = ws.head()
    before = _start_proposing(night, slot, proposer, request, broken)
    # The study's earlier comparable nights (engine/study.py): the digest's memory of them,
    # and the search's warm start (none with --no-warm-start).
    request.earlier_nights = night.memory.digest_nights()
    request.earlier = list(night.memory.points(ws))
    asked = time.monotonic()   # a stepped wall clock must not skew the proposer's time
    proposal, failure, failed_extra = _ask(proposer, request)
    # The proposer's time, a fact of its record: `autoloop status` sums it per trial.
    timing = {"propose_seconds": round(time.monotonic() - asked, 3)}
    outcome, outside, git_changed, linked = _put_back(night, slot, request, parent, before)
    timing.update(git_changed)
    if linked and proposal is not None:   # the edit, if any, went through the link: refused
        failure = f"{proposer.name} made {slot.ws.target} a link or a folder ({linked.split(':')[0]}); put back"
        proposal = None
    events = tuple(outcome.events)
    if proposal is None or outcome.target_deleted:
        ws.reset_to(parent)
        if proposal is not None:   # nothing to run: recorded as a skip, like a failed proposal
            failure = f"{proposer.name} deleted {ws.target}"
        extra = {**(dict(proposal.extra) if proposal is not None else failed_extra), **timing}
        return Skipped(failure, outside, events, extra) if failure is not None else None
    # A verify run of the best without a change is a measurement, not a proposal: an
    # agent proposing that revert is not repeating an earlier attempt.
    refused = (screen(ws, broken, queries.of_night(night.arbiter.records()), parent)
               or _measured_before(night, ws, parent))
    if refused:   # the proposal's facts stay with its record (a portfolio's choice: whose it was)
        extra = {**proposal.extra, **timing}
        if refused.duplicate_of is not None:
            extra["duplicate_of"] = refused.duplicate_of
        if refused.earlier_night is not None:
            extra["earlier_night"] = refused.earlier_night
        described = proposal.description if refused.duplicate_of is not None else None
        return Skipped(refused.reason, outside, events, extra, refused.duplicate_of, described)
    description = proposal.description
    if proposal.derived and outcome.commit_message:
        # The agent said what it did in its commits rather than in the description file.
        description = (f"{request.fix.description} (fix: {outcome.commit_message})" if request.fix
                       else outcome.commit_message)
    return Candidate(commit=None, parent=request.parent, parent_metric=request.parent_metric, description=description,
                     proposer=proposer.name, source=proposal.source, outside_changes=outside, git_events=events,
                     extra={**proposal.extra, **timing})


def _start_proposing(night: Night, slot: Slot, proposer: Proposer, request: ProposalRequest,
                     broken: str | None) -> reconcile.RefSnapshot:
    """The refs saved and the state file at ``proposing`` before the proposer is called;
    the refs as they were."""
    before = reconcile.snapshot(slot.ws, night.tag)
    # Before the state says proposing: recovery finds it for any kill during the call.
    before.save(night.layout.ref_snapshot(request.trial, request.attempt))
    request.process_token = secrets.token_hex(16)
    request.stop_event = night.stop.event
    request.on_start = lambda pids: slot.state.update(child_pids=pids)
    slot.state.enter("proposing", trial=request.trial, attempt=request.attempt,
                     kind="fix" if request.fix else "candidate", description=None, proposer=proposer.name,
                     best=request.parent, best_metric=request.parent_metric, candidate=None,
                     attempt_started_at=time.time(), child_token=request.process_token)
    if broken is not None:   # after the state says so: a kill now is recovered like any proposal
        slot.ws.target_path.write_text(broken)
    return before


def _ask(proposer: Proposer, request: ProposalRequest) -> tuple[Proposal | None, str | None, dict[str, Any]]:
    """(the proposal, why there is none, the facts of a failed one)."""
    try:
        proposal = proposer.propose(request)
    except ProposalFailed as e:
        return None, str(e), e.extra
    fault_point("proposed", request.trial)
    return proposal, None, {}


PutBack = tuple[reconcile.Reconciled, tuple[str, ...], dict[str, Any], str | None]


def _put_back(night: Night, slot: Slot, request: ProposalRequest, parent: str,
              before: reconcile.RefSnapshot) -> PutBack:
    """Git as the loop left it, every change outside the target reverted (quarantined), git's
    own configuration put back and a linked target detached: what reconcile did, the paths
    reverted, what git's configuration had (the record's extra) and how the target was linked."""
    ws, console = slot.ws, slot.console or night.console
    # Git first: a proposer that committed, switched branch or reset must not have the
    # scope check (or a reset) act on some other branch than the loop's.
    outcome = reconcile.reconcile(ws, night.tag, parent, request.trial, request.attempt, before)
    night.layout.ref_snapshot(request.trial, request.attempt).unlink(missing_ok=True)
    if outcome.events:
        console.line(f"#{request.trial}: git: {'; '.join(outcome.events)}")
    outside = tuple(ws.revert_out_of_scope(night.layout.quarantine(request.trial, request.attempt), base=parent))
    if outside:
        console.line(f"#{request.trial}: reverted changes outside {ws.target}: {', '.join(outside)}")
    git_changed = put_back_git(night, request.trial, request.attempt, console)
    linked = ws.detach_target(night.layout.quarantine(request.trial, request.attempt))
    return outcome, outside, git_changed, linked


def put_back_git(night: Night, trial: int, attempt: int, console: Console | Prefixed) -> dict[str, Any]:
    """Git's configuration and hooks put back as the night's snapshot has them, right after
    a proposer ran (its hook must not outlive the call, even when the proposal is skipped);
    the record's extra names what changed. The git area alone: a look-ahead proposal ends
    while another trial trains, whose own check must still find what that trial changed."""
    if night.inputs is None or night.inputs.area("git") is None:
        return {}
    evidence = night.layout.tampered(trial, attempt)
    with night.arbiter.lock:
        found = night.inputs.only("git").check(evidence)
    if found.unrestorable:
        raise NightError(found.message)
    if not found.git:
        return {}
    console.line(f"#{trial}: git's own configuration changed ({', '.join(found.git)}); put back, never run by "
                 f"autoloop (changed versions in {evidence.relative_to(night.ws.root)})")
    return {"git_config_changed": found.git}


def screen(ws: Workspace, broken: str | None = None, records: Sequence[LedgerRecord] = (),
           parent: str | None = None) -> Refusal | None:
    """Why a prepared edit must not run (a skip), or None: the one check between proposing
    and running. It changed nothing; a fix left the broken edit as it was; or it is the
    same change as an attempt already made from ``parent``, the best it was built on
    (duplicate_gate.py; a fix too: one that lands on a change already judged)."""
    if not ws.target_changed():
        return Refusal(f"proposal made no change to {ws.target}")
    edit = ws.target_path.read_text(errors="replace")
    if broken is not None and edit == broken:
        return Refusal("the fix made no change to the broken edit")
    return same_change(ws, edit, records, parent)


def _measured_before(night: Night, ws: Workspace, parent: str | None) -> Refusal | None:
    """The duplicate gate across nights: the same change on the same parent code was measured
    in an earlier comparable night; its result is the skip's reason, which the next prompt
    shows first (digest.py), so the proposer reads the number instead of paying for it again."""
    twin = night.memory.twin(ws, ws.target_path.read_text(errors="replace"), parent)
    if twin is None:
        return None
    r = twin.record
    result = (f"{r.metric_name} {r.metric:.6f}, {r.status}" if r.metric is not None and r.status != "crash"
              else f"{r.status} {r.crash or ''}".strip())
    why = f": {' '.join(r.reason.split())[:120]}" if r.reason else ""
    return Refusal(f"same change as night {twin.label} on the same code ({result}{why}); measured in an earlier "
                   "night, not trained again", twin.label, twin.label.split(" #")[0])


def same_change(ws: Workspace, edit: str, records: Sequence[LedgerRecord], parent: str | None) -> Refusal | None:
    """The duplicate gate: ``edit`` (the target's whole text) is the same change as an
    attempt already made from ``parent``. Also asked of a look-ahead candidate just before it
    runs (lookahead.rebase): the trial it was proposed beside may have tried it meanwhile."""
    twin = duplicate_gate.same_as(edit, _attempts_from(ws, records, parent))
    if twin is None:
        return None
    constants = duplicate_gate.changed_constants(ws.file_at(parent, ws.target) or "", edit) if parent else []
    what = f" ({', '.join(constants[:3])}, already tried from this best)" if constants else ""
    return Refusal(f"same change as #{twin.label}{what}", twin.label)


def _attempts_from(ws: Workspace, records: Sequence[LedgerRecord],
                   parent: str | None) -> Iterator[duplicate_gate.Earlier]:
    """The targets of the attempts built on ``parent`` (each commit once, newest first), read
    from git only as the gate needs them. An interrupted attempt was never judged: its
    change may run again (the optuna proposer asks for it after a resume)."""
    if parent is None:
        return
    seen = set()
    for r in reversed(records):
        if (r.parent == parent and r.commit and r.commit not in seen and r.kind != "baseline"
                and not queries.was_interrupted(r)):
            seen.add(r.commit)
            try:
                source = ws.file_at(r.commit, ws.target)
            except (ValueError, BadName, BadObject):   # a commit git no longer has: nothing to compare
                continue
            if source is not None:
                yield duplicate_gate.Earlier(trial_label(r.trial, r.attempt), source)
