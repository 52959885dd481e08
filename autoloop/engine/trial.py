"""One trial as a small state machine: propose, run, and what the decision asks for next.

A trial is one idea and every attempt it takes. Its steps, each a value:

* :class:`Propose`  ask the proposer for a change on the best the trial started from;
* :class:`Fix`      hand a trivially crashed attempt back to the proposer as a fix request;
* :class:`Run`      run one attempt (``attempt.AttemptRunner``) of a prepared candidate;
* :class:`Done`     the trial is over: ``ran``, ``failed`` (the proposal failed before
                    anything ran), ``duplicate`` (the duplicate gate refused a change
                    already tried from this best) or ``exhausted`` (no more ideas).

After each attempt, :meth:`Trial.after` reads the decision (never the record's extra) and
picks the next step, in this order: a stop request ends the trial; ``confirm`` re-runs the
same commit with another seed (as many times as the confirmation's count asks, one attempt
each, judged once on the mean at the last); ``replay`` merges the change onto the best another worker
set and runs it there; a trivial crash goes back as a fix request while fixes are left;
anything else ends the trial. A confirm or replay that a stop or a kill cut off after its
decision is taken up at the next start (:meth:`Trial.resume`). Proposing
(``candidate.prepare``) and running are separate steps, so a candidate can be prepared
ahead and run later.

Besides: the baseline and its noise samples (attempts of trial 0 before any proposal), and
``autoloop trial``'s one self-driven trial.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, cast

from autoloop.config.settings import Settings
from autoloop.core.errors import ConfigError, NightError
from autoloop.core.guards import missing_in_baseline, parse_guards
from autoloop.core.keep import skipped
from autoloop.core.power import ConfirmCount
from autoloop.engine import prune, scout
from autoloop.engine.attempt import AttemptPlan, AttemptRunner, Recorded
from autoloop.engine.candidate import Candidate, Claims, Skipped, fix_context, prepare, proposal_request
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.observe.console import shorten
from autoloop.proposers.base import ProposalRequest, Proposer
from autoloop.repo import reconcile
from autoloop.store import queries
from autoloop.store.ledger import AttemptKind, Draft, Extra, LedgerRecord
from autoloop.store.state import RunState, fault_point


@dataclass(frozen=True)
class Propose:
    pass


@dataclass(frozen=True)
class Fix:
    failed: LedgerRecord


@dataclass(frozen=True)
class Run:
    plan: AttemptPlan


@dataclass(frozen=True)
class Done:
    outcome: str        # ran | failed | duplicate | exhausted


Step = Propose | Fix | Run | Done


class Trial:
    """One trial in one slot, built on the best ``parent`` (the attempts' parent)."""

    def __init__(self, night: Night, slot: Slot, runner: AttemptRunner, proposer: Proposer | None, number: int,
                 parent: queries.Best, claims: Claims | None = None):
        self.night, self.slot, self.runner, self.proposer = night, slot, runner, proposer
        self.number, self.parent, self.claims = number, parent, claims
        self.fixes = 0
        self.last: Recorded | None = None

    def run(self, first: Candidate | None = None) -> str:
        """Step until done; ``first``: a candidate prepared already (else: propose one)."""
        return self.finish(self.begin(first))

    def begin(self, first: Candidate | None = None) -> Step:
        """The first step taken: the proposal made (or ``first`` taken), the first attempt
        planned and not yet run. A slot that looks ahead starts the next proposal here."""
        return self.propose() if first is None else Run(self.first_plan("candidate", first))

    def finish(self, step: Step) -> str:
        while not isinstance(step, Done):
            step = self.advance(step)
        return step.outcome

    def advance(self, step: Step) -> Step:
        if isinstance(step, Done):
            return step
        if isinstance(step, Propose):
            return self.propose()
        if isinstance(step, Fix):
            return self.fix(step.failed)
        self.last = self.runner.run(step.plan)
        return self.after(self.last)

    # -- the steps ------------------------------------------------------------------------

    def propose(self) -> Step:
        request = proposal_request(self.night.settings, self.slot.ws, self.night.layout, self.night.arbiter.records(),
                                   self.number, 1, self.parent, env=self.slot.env)
        prepared = self._prepare(request)
        if prepared is None:
            self.slot.state.enter("idle")
            return Done("exhausted")
        if isinstance(prepared, Skipped):
            # A duplicate keeps its description: the digest tells the agent what it repeated.
            self._skip(1, prepared.reason, prepared.description or "-", prepared)
            return Done("failed" if prepared.duplicate_of is None else "duplicate")
        return Run(self.first_plan("candidate", prepared))

    def fix(self, failed: LedgerRecord) -> Step:
        """Hand the broken edit back to the proposer with the evidence; run the fix."""
        self.fixes += 1
        attempt = queries.next_attempt(self.night.arbiter.records(), self.number)
        context, broken = fix_context(self.slot.ws, self.night.layout, failed)
        request = proposal_request(self.night.settings, self.slot.ws, self.night.layout, self.night.arbiter.records(),
                                   self.number, attempt, self.parent, fix=context, env=self.slot.env)
        prepared = self._prepare(request, broken)
        if not isinstance(prepared, Candidate):
            if prepared is not None:
                self._skip(attempt, f"fix failed: {prepared.reason}", failed.description, prepared)
            else:
                self._reset()
            return Done("ran")
        if "hypothesis" not in prepared.extra:   # the fixed idea is still the idea it was
            prepared = replace(prepared, extra={**prepared.extra, **carried(failed.extra)})
        return Run(self.first_plan("fix", prepared, attempt))

    def after(self, done: Recorded) -> Step:
        """The next step, from the decision on the attempt just recorded."""
        record, action = done.record, done.decision.action
        scout.say_if_switched_off(self.night, record)
        prune.say_if_turned_off(self.night, record)
        if self.night.stop.is_set():
            return Done("ran")
        if action == "promote":
            return Run(self._promotion(record, done.plan.candidate))
        scout.after_keep(self.night, self.runner, record)
        if action == "confirm":
            return Run(self._confirmation(done))
        if action == "replay":
            return Run(self._replay(done))
        if record.crash == "trivial" and record.kind != "confirm" and self._may_fix():
            return Fix(record)
        return Done("ran")

    # -- plans ----------------------------------------------------------------------------

    def plan(self, kind: AttemptKind, candidate: Candidate, attempt: int = 1, **more: Any) -> AttemptPlan:
        return AttemptPlan(self.number, attempt, kind, candidate, self.night.settings.seed, **more)

    def first_plan(self, kind: AttemptKind, candidate: Candidate, attempt: int = 1) -> AttemptPlan:
        """A new proposal's first run: at the scout budget while scouting (the kind it will
        have at the full budget kept in its record), else at the full budget."""
        if not scout.active(self.night):
            return self.plan(kind, candidate, attempt)
        return self.plan("scout", replace(candidate, extra={**candidate.extra, "scout_of": kind}), attempt,
                         can_confirm=False)

    def _promotion(self, scouted: LedgerRecord, candidate: Candidate) -> AttemptPlan:
        """A scout run close enough to the best's: the same commit at the full budget, judged
        as the candidate (or fix) it is against the best the trial started from."""
        kind: AttemptKind = "fix" if scouted.extra.get("scout_of") == "fix" else "candidate"
        full = Candidate(commit=scouted.commit, parent=candidate.parent, parent_metric=candidate.parent_metric,
                         description=scouted.description, proposer=scouted.proposer,
                         source=scouted.extra.get("source"),
                         extra={**carried(scouted.extra), "scouted": scouted.attempt})
        return self.plan(kind, full, queries.next_attempt(self.night.arbiter.records(), self.number))

    def _confirmation(self, done: Recorded) -> AttemptPlan:
        """A within-noise gain: the same commit once more with a new seed, judged with the runs
        before it (at the last run the confirmation's count asks for: on the mean of all)."""
        again = replace(done.plan.candidate, commit=done.record.commit, outside_changes=(), git_events=(),
                        replay_of=None, extra=carried(done.record.extra))
        # keep.decide asks for a confirmation only of a measured run: it has a metric.
        assert done.record.metric is not None, "a confirmation of an unmeasured run"
        runs = (*done.plan.prior_runs, done.record.metric)
        return self._confirm_plan(runs, done.decision.confirmation, again, done.plan.replays)

    def _confirm_plan(self, runs: tuple[float, ...], count: ConfirmCount | None, again: Candidate,
                      replays: int) -> AttemptPlan:
        """``again`` (the commit of ``runs``) run with the next seed, judged with ``runs``;
        ``count``: the confirmation's count (None: this re-run is its last)."""
        attempt = queries.next_attempt(self.night.arbiter.records(), self.number)
        return AttemptPlan(self.number, attempt, "confirm", again, self.night.settings.seed + attempt - 1,
                           prior_runs=runs, can_confirm=False, replays=replays, confirmation=count)

    def _replay(self, done: Recorded) -> AttemptPlan:
        """Its change merged onto the best another worker set (the attempt left the work tree
        there), to be run again as a confirm attempt that must win on it."""
        # The arbiter asks for a replay only when the change merged (Arbiter.decide).
        assert done.merged is not None, "a replay without a merged change"
        return self._replay_plan(done.record, (done.record.best, done.record.best_metric), done.merged,
                                 done.plan.replays + 1)

    def _replay_plan(self, record: LedgerRecord, onto: queries.Best, merged: str, replays: int) -> AttemptPlan:
        fault_point("replaying", record.trial, record.attempt)
        self.parent = onto
        self.slot.ws.target_path.write_text(merged)
        moved = Candidate(commit=None, parent=onto[0], parent_metric=onto[1], description=record.description,
                          proposer=record.proposer, source=record.extra.get("source"), replay_of=record.commit,
                          extra=carried(record.extra))
        attempt = queries.next_attempt(self.night.arbiter.records(), self.number)
        return self.plan("confirm", moved, attempt, replays=replays)

    def resume(self, record: LedgerRecord) -> str:
        """The step a decision asked for and the night never took (``queries.pending_next``),
        or an attempt a kill cut off while training (``queries.pending_reruns``)."""
        if queries.interrupted_in_training(record):
            return self.resume_interrupted(record)
        if record.next == "promote":
            return self.resume_promotion(record)
        return self.resume_confirmation(record) if record.next == "confirm" else self.resume_replay(record)

    def resume_promotion(self, record: LedgerRecord) -> str:
        """A scout run promoted to the full budget, the full run never started (a kill or a
        stop came between): that run now, against the best the trial started from."""
        self.parent = (record.best, record.best_metric) if record.parent is None else (
            record.parent, next((r.best_metric for r in reversed(self.night.arbiter.records())
                                 if r.best == record.parent), None))
        (self.slot.console or self.night.console).line(
            f"#{record.trial}: resuming its full-budget run (promoted by its scout run, not run before the night "
            "stopped)")
        scouted = Candidate(commit=record.commit, parent=self.parent[0], parent_metric=self.parent[1],
                            description=record.description, proposer=record.proposer)
        return self.finish(Run(self._promotion(record, scouted)))

    def resume_interrupted(self, record: LedgerRecord) -> str:
        """Run again, as the trial's next attempt, the attempt a kill interrupted while it
        trained (its record, crash "interrupted (...)", stays): the same commit, kind and
        seed, judged against the best it was built on. A confirmation is taken up again from
        the decision that asked for it, as after a stop."""
        records = self.night.arbiter.records()
        (self.slot.console or self.night.console).line(
            f"#{record.trial}: running attempt {record.trial}.{record.attempt} again: a kill interrupted it "
            "while training (once; --no-rerun-interrupted: never)")
        if record.kind == "confirm":
            asked = next((r for r in reversed(records) if r.trial == record.trial and r.next in ("confirm", "replay")
                          and r.attempt < record.attempt), None)
            return self.resume(asked) if asked is not None else "ran"
        parent_metric = next((r.best_metric for r in reversed(records) if r.best == record.parent), None)
        self.parent = (record.parent, parent_metric)
        again = Candidate(commit=record.commit, parent=record.parent, parent_metric=parent_metric,
                          description=record.description, proposer=record.proposer,
                          source=record.extra.get("source"),
                          extra={**carried(record.extra), "rerun_of": record.attempt})
        attempt = queries.next_attempt(records, self.number)
        if record.kind == "scout" and not scout.active(self.night):
            # Scouting is off now (switched off, or --scout not given again): a sample of the
            # best has nothing left to measure, a candidate gets its full run.
            if record.commit == record.parent:
                return "ran"
            kind: AttemptKind = "fix" if record.extra.get("scout_of") == "fix" else "candidate"
            return self.finish(Run(self.plan(kind, again, attempt)))
        return self.finish(Run(self.plan(record.kind, again, attempt)))

    def resume_confirmation(self, record: LedgerRecord) -> str:
        """A within-noise gain whose confirmation a stop or a kill cut off after a decision
        (the ledger's last word on the trial is ``next: confirm``): the same commit again
        with a new seed, judged with the runs it has, until the count its first record chose
        (``extra.confirmation``), as it would have been. If the best has moved since, the
        mean is judged as any win on a moved best is: replayed or stale."""
        # A confirm decision leaves the best where the trial started: its record carries it.
        self.parent = (record.best, record.best_metric)
        (self.slot.console or self.night.console).line(
            f"#{record.trial}: resuming its confirmation (decided, not run before the night stopped)")
        again = Candidate(commit=record.commit, parent=record.best, parent_metric=record.best_metric,
                          description=record.description, proposer=record.proposer,
                          source=record.extra.get("source"), extra=carried(record.extra))
        records = self.night.arbiter.records()
        assert record.commit is not None, "a confirmation of nothing"   # decided for a measured run
        runs = tuple(queries.runs_of(records, record.commit))
        count = ConfirmCount.of(record.extra.get("confirmation"))
        return self.finish(Run(self._confirm_plan(runs, count, again, queries.replays_of(records, self.number))))

    def resume_replay(self, record: LedgerRecord) -> str:
        """A replay that a kill interrupted between its decision and its run (the ledger's
        last word on the trial is ``next: replay``): its change merged onto the best now and
        run, as it would have been; a skip when it no longer merges or is in the best."""
        records, ws = self.night.arbiter.records(), self.slot.ws
        best = queries.best(records)
        now, parent, commit = best[0], record.parent, record.commit
        # A replay is decided for a committed change built on a best, onto another best.
        assert now is not None and parent is not None and commit is not None, "a replay of nothing"
        if ws.head() != now:
            ws.reset_to(now)
        merged = ws.merge_change(parent, now, commit)
        (self.slot.console or self.night.console).line(
            f"#{record.trial}: resuming its replay on {now[:7]} (interrupted before it ran)")
        if merged is None or merged == ws.file_at(now, ws.target):
            self.parent = best
            why = "conflicts with" if merged is None else "is already in"
            record_skip(self.night, self.slot, self.number, queries.next_attempt(records, self.number),
                        record.proposer, f"stale: the interrupted replay {why} the best {now[:7]}",
                        record.description, (), (), best)
            return "ran"
        step: Step = Run(self._replay_plan(record, best, merged, queries.replays_of(records, record.trial)))
        while not isinstance(step, Done):
            step = self.advance(step)
        return step.outcome

    # -- helpers --------------------------------------------------------------------------

    def _may_fix(self) -> bool:
        # A fix is built on the best the trial started from: not once another worker moved it.
        return (self.proposer is not None and self.proposer.can_fix
                and self.fixes < self.night.settings.max_fix_attempts
                and self.night.arbiter.best()[0] == self.parent[0])

    def _proposing(self) -> Proposer:
        # Only judge_edit makes a Trial without a proposer, and gives it its candidate: it
        # never proposes, and never fixes (_may_fix).
        assert self.proposer is not None, "a trial without a proposer asked to propose"
        return self.proposer

    def _prepare(self, request: ProposalRequest, broken: str | None = None) -> Candidate | Skipped | None:
        if self.claims is None:
            return prepare(self.night, self.slot, self._proposing(), request, broken)
        with self.claims.proposing(self.slot.worker) as others:
            request.in_flight = others
            prepared = prepare(self.night, self.slot, self._proposing(), request, broken)
            if isinstance(prepared, Candidate):
                # "trial": the optuna proposer leaves the suggestions of trials still running open
                # (OptunaProposer._settle), rather than failing them for want of a record.
                self.claims.claim(self.slot.worker, {"parent": request.parent, "kind": "candidate",
                                                     "description": prepared.description, "worker": self.slot.worker,
                                                     "trial": request.trial})
            return prepared

    def _reset(self) -> None:
        if self.parent[0]:
            self.slot.ws.reset_to(self.parent[0])
        self.slot.state.enter("idle")

    def _skip(self, attempt: int, reason: str, description: str, found: Skipped) -> None:
        self._reset()
        record_skip(self.night, self.slot, self.number, attempt, self._proposing().name, reason, description,
                    found.outside_changes, found.git_events, self.parent, found.extra)


def carried(extra: dict[str, Any]) -> dict[str, Any]:
    """What a re-run of the same change keeps of its first record's extra: the hypothesis
    (the agent's why, from its hypothesis file), so that the record that keeps it says why.
    Not the agent's usage: no new call."""
    return {"hypothesis": extra["hypothesis"]} if extra.get("hypothesis") else {}


def record_skip(night: Night, slot: Slot, trial: int, attempt: int, proposer: str, reason: str, description: str,
                outside: tuple[str, ...], events: tuple[str, ...], parent: queries.Best,
                extra: dict[str, Any] | None = None) -> LedgerRecord:
    """A proposal that failed before anything ran: in the ledger as a skip (not in the TSV).
    ``extra``: the facts of a proposal that was made but cannot run (Proposal.extra)."""
    now = time.time()
    facts: Extra = {**cast(Extra, extra or {}), **({"git_events": list(events)} if events else {})}
    record = night.arbiter.record(Draft(
        trial=trial, attempt=attempt, started_at=now, ended_at=now, proposer=proposer,
        parent=parent[0], description=description, metric_name=night.settings.metric,
        outside_changes=list(outside), extra=facts,
    ), skipped(reason, parent, night.arbiter.best()), slot.worker)
    # The ledger keeps the reason whole (up to ~500 characters); the screen gets it shortened.
    (slot.console or night.console).line(f"#{trial} skipped: {shorten(reason)}")
    return record


# ------------------------------------------------------------------------------ the baseline


def run_baseline(night: Night, runner: AttemptRunner) -> LedgerRecord:
    """The unmodified target, as trial 0 (or the next trial number), judged against nothing."""
    head = runner.slot.ws.head()
    trial = queries.next_trial(night.arbiter.records())
    baseline = Candidate(commit=head, parent=head, parent_metric=None, description="baseline", proposer="-")
    plan = AttemptPlan(trial, 1, "baseline", baseline, night.settings.seed)
    record = runner.run(plan).record
    if record.status == "ended" and not night.stop.is_set():
        raise NightError(f"the baseline run could not be measured: {record.reason}; nothing is compared without "
                         "it: run again with --resume when the cluster has room")
    if record.status != "keep" and not night.stop.is_set():   # a signal's stop is no failure of the baseline
        raise NightError(f"the baseline run of the unmodified {night.settings.target} failed "
                         f"({record.crash}: {record.reason}); see results/{record.log_path}")
    if record.status == "keep":
        check_guard_names(night.settings, record)
    return record


def check_guard_names(settings: Settings, baseline: LedgerRecord | None) -> None:
    """Refuse, in one line naming the flag, a --guard on a name the baseline does not print:
    it could never hold. Called at start when the ledger has a baseline (before anything
    runs), else as soon as the baseline's output is read (before any candidate)."""
    if baseline is None or not settings.guards:
        return
    missing = missing_in_baseline(parse_guards(settings.guards), baseline.metrics)
    if missing:
        printed = ", ".join(sorted(baseline.metrics)) or "no NAME: value lines"
        raise ConfigError(f"--guard: the baseline (results/{baseline.log_path}) does not print "
                          f"{', '.join(repr(m) for m in missing)}; it prints: {printed}")


def measure_noise(night: Night, runner: AttemptRunner) -> None:
    """Run the best commit --noise-runs more times with seeds seed+1.. as attempts of its
    trial; the spread of its runs is the noise estimate, the best its mean."""
    s = night.settings
    records = night.arbiter.records()
    best = queries.best(records)[0]
    owner = next((r for r in reversed(records) if r.commit == best and r.status == "keep"), None)
    if not best or s.noise_runs <= 0 or owner is None:
        return
    prior = queries.runs_of(records, best)
    attempt = queries.next_attempt(records, owner.trial) - 1
    for k in range(1, s.noise_runs + 1):
        if night.stop.is_set():
            return
        attempt += 1
        candidate = Candidate(commit=best, parent=best, parent_metric=night.arbiter.best()[1],
                              description=f"noise sample {k}/{s.noise_runs}", proposer="-")
        record = runner.run(AttemptPlan(owner.trial, attempt, "confirm", candidate, s.seed + len(prior),
                                        prior_runs=tuple(prior), noise_sample=(k, s.noise_runs))).record
        if record.metric is not None and record.status == "keep":
            prior = [*prior, record.metric]
    sigma = night.arbiter.noise()
    if sigma is not None:
        night.console.line(f"noise: sigma {sigma:.6f} from {len(prior)} runs of {best[:7]}; best is their mean "
                           f"{night.arbiter.best()[1]:.6f}")


# ------------------------------------------------------------------------------ autoloop trial


def judge_edit(night: Night, runner: AttemptRunner, description: str) -> LedgerRecord:
    """`autoloop trial -m DESC`: the current edit of the target as one trial, for an agent
    that drives itself (it edits, calls this, reads the verdict). The first call on a
    branch runs the baseline of the unmodified target first."""
    ws, console = night.ws, night.console
    trial = queries.next_trial(night.arbiter.records())
    best = night.arbiter.best()[0]
    events: list[str] = []
    if best and runner.slot.state.state.tag == night.tag and ws.head() != best:
        # An agent that committed its edit (or amended the best, or reset): the net change
        # on top of the best is the candidate, the branch goes back to the best.
        events = reconcile.reconcile(ws, night.tag, best, trial, 1).events
        if events:
            console.line(f"git: {'; '.join(events)}")
    base = ws.head()
    outside = ws.revert_out_of_scope(night.layout.quarantine(trial, 1), base=base)
    if outside:
        console.line(f"reverted changes outside {night.settings.target}: {', '.join(outside)}")
    reason = night.low_disk()
    if reason:
        raise NightError(reason)
    check_guard_names(night.settings, queries.baseline(night.arbiter.records()))
    runner.slot.state.replace(RunState(tag=night.tag, pid=os.getpid(), run_started_at=time.time()))
    if queries.baseline(night.arbiter.records()) is None:
        edit = ws.target_path.read_text() if ws.target_changed() else None
        if edit is not None:
            ws.reset_to(base)
        run_baseline(night, runner)
        measure_noise(night, runner)
        if edit is not None:
            ws.target_path.write_text(edit)
    if not ws.target_changed():
        raise NightError(f"{night.settings.target} has no change to try; edit it first")
    parent = night.arbiter.best()
    trial = queries.next_trial(night.arbiter.records())
    one = Trial(night, runner.slot, runner, None, trial, parent)
    one.run(Candidate(commit=None, parent=parent[0], parent_metric=parent[1], description=description,
                      proposer="self", outside_changes=tuple(outside), git_events=tuple(events)))
    assert one.last is not None, "a trial given its candidate runs it"
    return one.last.record
