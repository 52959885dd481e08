"""Look-ahead: the next trial is proposed while the current one trains.

A coding agent takes minutes per proposal; proposing, then training, then proposing again
leaves the device idle for every one of them. A slot that looks ahead asks the proposer for
trial m as soon as its trial n has a candidate to run, in a worktree of its own
(``worktrees/ahead``; worker k's ``worktrees/w<k>-ahead``) on the best n started from, and
the request names the trials in flight (n among them, with what it tries) so that the
proposal is another idea. n's own steps come first: its confirmation re-run, its replay,
its fix request (which needs n's crash) all run before m. When n is done, ``rebase``:

* the best did not move: the prepared commit runs as it is;
* it moved (n was kept, or another worker's trial was): the change is merged three-way onto
  the new best (``Workspace.merge_change``, as a replay is) and judged against that best;
  where the merge conflicts only because both set the same constants (agents come back to
  the same learning rate again and again), the change is *re-based*: its values set on the
  new best (``revert.rebase_constants``), described from the new best's values; a real
  conflict, or a change the best already holds (the values agree now), is recorded as a skip
  and the slot asks the proposer afresh: nothing trains on a stale base;
* either way the duplicate gate asks again (``candidate.same_change``): n, recorded since the
  candidate was screened, may have made the same change; then it is a skip "same change as
  #n", counted like any duplicate.

Crash safety. The proposal's call is an attempt in flight like any other: the look-ahead's
state file (``state-ahead.json``, ``state-w<k>-ahead.json``) says ``proposing`` before it
starts, so a kill during the call is recovered as an interrupted proposal. A finished
proposal is committed in the look-ahead worktree, kept under
``refs/autoloop/<tag>/prepared/<m>`` and written to ``results/prepared/<m>.json``, in that
order, before it counts as prepared; only then does the state file go idle. A prepared
candidate is pending exactly while the ledger holds no record of its trial: after Ctrl-C or
``kill -9`` the next ``--resume`` runs it first (``pending``) or records why not; once its
trial has a record it never runs again.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from autoloop.core.layout import Layout, prepared_ref
from autoloop.core.revert import rebase_constants
from autoloop.engine.candidate import Candidate, Claims, Skipped, prepare, proposal_request, same_change
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.engine.trial import record_skip
from autoloop.observe.console import Prefixed
from autoloop.proposers.base import Proposer
from autoloop.repo.workspace import Workspace
from autoloop.repo.worktrees import (
    ahead_workspace,
    ensure_ahead_worktree,
    ensure_worktrees_ignored,
    remove_ahead_worktree,
)
from autoloop.store import queries
from autoloop.store.atomic import atomic_write
from autoloop.store.state import RunState, StateFile, fault_point


@dataclass(frozen=True)
class Prepared:
    """A candidate proposed ahead for trial ``trial`` and committed (under its prepared ref);
    ``results/prepared/<trial>.json`` holds it: everything its first attempt needs, also
    after a kill. The file is one flat JSON object: the candidate's fields (``replay_of``
    aside: a prepared change is new) between ``tag``/``trial`` and ``prepared_at``."""

    tag: str
    trial: int
    candidate: Candidate      # parent: the best it was proposed on; extra: the proposal's facts and time
    prepared_at: float

    @property
    def commit(self) -> str:
        # Made of a commit (Lookahead._prepare), and read back only with one (from_json).
        assert self.candidate.commit is not None, "a prepared candidate without its commit"
        return self.candidate.commit

    def on(self, best: queries.Best) -> Candidate:
        """The candidate as it runs on ``best`` when the best has not moved since."""
        return replace(self.candidate, parent=best[0], parent_metric=best[1],
                       extra={**self.candidate.extra, "lookahead": {"prepared_on": self.candidate.parent}})

    def to_json(self) -> str:
        fields = _CANDIDATE.dump_python(self.candidate, exclude={"replay_of"})
        fields = {_ON_DISK.get(k, k): v for k, v in fields.items()}   # in the candidate's field order
        return _OBJECT.dump_json({"tag": self.tag, "trial": self.trial, **fields,
                                  "prepared_at": self.prepared_at}).decode()

    @classmethod
    def from_json(cls, text: str) -> Prepared:
        """Raises ValidationError when the text is not such a record (a commit included)."""
        head = _PreparedHead.model_validate_json(text)
        fields = {_IN_CODE.get(k, k): v for k, v in _OBJECT.validate_json(text).items()}
        return cls(head.tag, head.trial, _CANDIDATE.validate_python(fields), head.prepared_at)


class _PreparedHead(BaseModel):
    """The file's own fields beside the candidate's (each reading ignores the other's)."""

    tag: str
    trial: int
    commit: str               # the candidate's: a prepared one always has it
    prepared_at: float


_CANDIDATE = TypeAdapter(Candidate)
_OBJECT = TypeAdapter(dict[str, Any])
# The file's keys for the candidate's fields that were renamed in code (the file is read
# back by the next start, maybe of another version): the parent is "base" on disk.
_ON_DISK = {"parent": "base", "parent_metric": "base_metric"}
_IN_CODE = {v: k for k, v in _ON_DISK.items()}


def key(worker: int | None) -> str:
    """A slot's look-ahead, where the scheduler keeps reservations and claims by slot."""
    return "ahead" if worker is None else f"ahead-w{worker}"


# ------------------------------------------------------------------------------ the files


def save(layout: Layout, prepared: Prepared) -> None:
    layout.prepared_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.prepared(prepared.trial), prepared.to_json())


def done(layout: Layout, trial: int) -> None:
    """Its trial has a record now: the file's job is over (the commit stays under its ref)."""
    layout.prepared(trial).unlink(missing_ok=True)


def pending(night: Night) -> list[Prepared]:
    """The candidates a stopped or killed run prepared and never started, by trial; the
    files of those whose trial has a record (it ran, or was recorded as dropped) removed."""
    layout, console = night.layout, night.console
    ran = {r.trial for r in night.arbiter.records()}
    found = []
    for path in sorted(layout.prepared_dir.glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        try:
            prepared = Prepared.from_json(path.read_text())
        except (OSError, ValidationError):
            aside = path.with_suffix(".unreadable")
            os.replace(path, aside)
            console.line(f"look-ahead: {path.name} cannot be read; set aside as {aside.name}")
            continue
        if prepared.tag != night.tag:
            continue
        if prepared.trial in ran:
            path.unlink()
            continue
        console.line(f"#{prepared.trial}: prepared ahead [{prepared.commit[:7]}] and not yet run: it runs first")
        found.append(prepared)
    return found


# ------------------------------------------------------------------------------ taking one


@dataclass(frozen=True)
class Dropped:
    """A prepared candidate that may not run (its skip is recorded): ``outcome`` is what the
    scheduler counts, ``duplicate`` when the duplicate gate refused it, else ``ran``."""

    outcome: str


def rebase(night: Night, slot: Slot, prepared: Prepared, best: queries.Best) -> Candidate | Dropped:
    """The prepared candidate as it may run on ``best`` (the slot's work tree is there), or
    Dropped when it may not (a conflict, the best holds it already, or the trial it was
    proposed beside made the same change meanwhile): then it is recorded as a skip and the
    proposer is asked afresh."""
    console = slot.console or night.console
    ws, cand, (now, _) = slot.ws, prepared.candidate, best
    # The scheduler looks ahead only once the baseline is in: it was proposed on a best and
    # runs on one.
    assert now is not None and cand.parent is not None, "a look-ahead without a best"
    moved = now != cand.parent
    merged = ws.merge_change(cand.parent, now, prepared.commit) if moved else None
    provenance: dict[str, Any] = {"prepared": prepared.commit, "prepared_on": cand.parent,
                                  **({"merged_onto": now} if moved else {})}
    extra = {**cand.extra, "lookahead": provenance} if moved else dict(cand.extra)

    def skip(reason: str, more: dict[str, Any] | None = None) -> None:
        record_skip(night, slot, prepared.trial, 1, cand.proposer, reason, cand.description,
                    cand.outside_changes, cand.git_events, best, {**extra, "lookahead": provenance, **(more or {})})

    rebased: list[tuple[str, str, str]] | None = None
    if moved and merged is None:
        merged, rebased = _onto_constants(ws, cand.parent, now, prepared.commit)
        if rebased is not None:
            provenance["rebased"] = [list(m) for m in rebased]
    if moved and (merged is None or merged == ws.file_at(now, ws.target)):
        why = "conflicts with" if merged is None else "is already in"
        skip(f"look-ahead: the change prepared on {cand.parent[:7]} {why} the new best {now[:7]}; "
             "the proposer is asked afresh")
        return Dropped("ran")
    # The gate screened it when it was prepared, but the trial it was proposed beside has
    # been recorded since and may have made the same change: it is not trained twice.
    edit = merged if merged is not None else ws.file_at(prepared.commit, ws.target) or ""
    refused = same_change(ws, edit, queries.of_night(night.arbiter.records()), now)
    if refused is not None:
        skip(refused.reason, {"duplicate_of": refused.duplicate_of})
        return Dropped("duplicate")
    if merged is None:
        return prepared.on(best)
    ws.target_path.write_text(merged)
    if rebased:
        # The keep moved the constants this change sets: the change is its values set on the
        # new best, and says so from the new best's values.
        moves = "; ".join(f"{name} {old} -> {new}" for name, old, new in rebased)
        console.line(f"#{prepared.trial}: the best moved to {now[:7]} while it was prepared and set the same "
                     f"constants; re-based onto it: {moves}")
        extra = {**extra, "lookahead": provenance}
        return replace(cand, commit=None, parent=now, parent_metric=best[1], extra=extra,
                       description=f"{moves} (re-based onto {now[:7]}; proposed as: {cand.description})")
    console.line(f"#{prepared.trial}: the best moved to {now[:7]} while it was prepared; merged onto it")
    return replace(cand, commit=None, parent=now, parent_metric=best[1], extra=extra)


def _onto_constants(ws: Workspace, base: str, now: str,
                    commit: str) -> tuple[str | None, list[tuple[str, str, str]] | None]:
    """A prepared change that conflicts with the new best only on constants both set: its
    values set on the new best, and the constants that moved (None, None: a real conflict)."""
    texts = [ws.file_at(sha, ws.target) for sha in (base, now, commit)]
    if any(t is None for t in texts):
        return None, None
    found = rebase_constants(*texts)   # type: ignore[arg-type]
    if found is None:
        return None, None
    return found


# ------------------------------------------------------------------------------ proposing ahead


@dataclass
class Ahead:
    """What one look-ahead proposal came to: a prepared candidate, or the scheduler's outcome
    of a trial that never ran (``failed``: a skip recorded; ``exhausted``)."""

    prepared: Prepared | None
    outcome: str


class Lookahead:
    """One slot's look-ahead: its worktree, its state file, the proposal in flight (a thread)."""

    def __init__(self, night: Night, slot: Slot, proposer: Proposer, claims: Claims):
        self.night, self.proposer, self.claims = night, proposer, claims
        self.key = key(slot.worker)
        ensure_worktrees_ignored(night.ws)
        ensure_ahead_worktree(night.ws, slot.worker, night.tag, night.arbiter.best()[0] or night.ws.head())
        ws = ahead_workspace(night.ws.root, slot.worker, night.tag, night.settings.target, night.layout.root)
        state = StateFile(night.layout.root, Layout.ahead_state_name(slot.worker),
                          RunState(tag=night.tag, pid=os.getpid(), run_started_at=time.time()))
        label = "[ahead]" if slot.worker is None else f"[w{slot.worker} ahead]"
        self.slot = Slot(ws, state, slot.worker, slot.executor, slot.env, Prefixed(night.console, label))
        self._thread: threading.Thread | None = None
        self._result: Ahead | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, trial: int, best: queries.Best) -> None:
        """Propose trial ``trial`` on ``best`` in the background."""
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._propose, args=(trial, best), daemon=True,
                                        name=f"autoloop-{self.key}")
        self._thread.start()

    def wait(self) -> Ahead:
        """The proposal's end (an error in it is raised here, in the slot's thread)."""
        assert self._thread is not None
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def close(self) -> None:
        """At the end of the slot: the proposal in flight ended (the night's stop is set by
        then), the worktree removed unless a proposal is left in flight for --resume. A
        prepared candidate's file stays: the next --resume runs it."""
        if self._thread is not None:
            self._thread.join()
        self.slot.ws.close()
        if self.slot.state.state.in_flight:
            return
        remove_ahead_worktree(self.night.ws, self.slot.worker, self.night.tag)
        self.slot.state.path.unlink(missing_ok=True)

    def _propose(self, trial: int, best: queries.Best) -> None:
        try:
            self._result = self._prepare(trial, best)
        except BaseException as e:   # raised again in the slot's thread by wait()
            self._error = e

    def _prepare(self, trial: int, best: queries.Best) -> Ahead:
        night, slot = self.night, self.slot
        ws = slot.ws
        if best[0] and ws.head() != best[0]:
            ws.reset_to(best[0])
        request = proposal_request(night.settings, ws, night.layout, night.arbiter.records(), trial, 1, best,
                                   env=slot.env)
        with self.claims.proposing(self.key) as others:
            request.in_flight = others    # the slot's own trial n among them
            found = prepare(night, slot, self.proposer, request)
            if isinstance(found, Candidate):
                self.claims.claim(self.key, {"parent": best[0], "kind": "candidate", "trial": trial,
                                             "description": found.description, "worker": slot.worker})
        if found is None:
            slot.state.enter("idle")
            return Ahead(None, "exhausted")
        if isinstance(found, Skipped):
            if best[0]:
                ws.reset_to(best[0])
            slot.state.enter("idle")
            record_skip(night, slot, trial, 1, self.proposer.name, found.reason, "-", found.outside_changes,
                        found.git_events, best, found.extra)
            return Ahead(None, "failed")
        commit = ws.commit_candidate(f"{found.description}\n\nautoloop trial {trial}.1 ({found.proposer}, "
                                     f"prepared ahead)")
        ws.save_ref(prepared_ref(night.tag, trial), commit, f"autoloop trial {trial} prepared ahead")
        prepared = Prepared(night.tag, trial, replace(found, commit=commit, parent=best[0], parent_metric=best[1]),
                            time.time())
        save(night.layout, prepared)
        fault_point("prepared", trial)
        slot.state.enter("idle", candidate=None, child_pids=[], child_token=None)
        if best[0]:
            ws.reset_to(best[0])
        (slot.console or night.console).line(f"#{trial} prepared: {found.description} [{commit[:7]}]")
        return Ahead(prepared, "prepared")
