"""The scheduler: N worker slots running trials until something says stop.

``autoloop run`` is one Scheduler, whatever ``--workers`` says. First the baseline and its
noise samples, in the main checkout. Then N slots, each a thread with an
:class:`~autoloop.engine.attempt.AttemptRunner` and its own work tree: with N = 1 that is the main
checkout itself (the single loop), with N > 1 a git worktree per slot (``worktrees.py``)
and a device each (``devices.py``). Each slot, again and again: under the arbiter's lock it
asks whether to stop, reserves the next trial number and takes the current best as the
trial's parent; then it runs one :class:`~autoloop.engine.trial.Trial` from there.

With look-ahead (``--lookahead 1``, ``lookahead.py``) each slot has a second work tree where
the next trial is proposed while its trial runs (the first one while the baseline's noise
samples run); the slot takes that prepared candidate first, then a fresh proposal. Each
prepared trial is reserved (and counted toward ``--max-trials``) when its proposal starts;
one left by a stopped or killed run is taken before any new trial.

An agent's preflight (``proposers/preflight.py``) comes first, before the baseline: a
failure there is a :class:`~autoloop.proposers.preflight.PreflightError` and nothing runs.

Stop conditions, checked before each trial: a slot's fatal error, the proposer out of
ideas, a signal, ``--max-trials`` (trials in flight count), the proposer failing
``--max-*-failures`` times in a row, the agent's reported cost past ``--max-agent-cost``,
a disk under ``--min-free-gb``, and ``--hours`` (no
trial starts that could not end in time, from the median of the recent attempts). A skip
counts toward ``--max-trials``: it was a proposer call. A duplicate (the duplicate gate's
skip) counts toward the failures in a row only when the one before it was a duplicate too.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any

from autoloop.core.durations import expected_seconds, format_duration
from autoloop.core.layout import Layout
from autoloop.engine import lookahead, scout
from autoloop.engine.attempt import AttemptRunner
from autoloop.engine.candidate import Candidate, Claimant, Claims
from autoloop.engine.lookahead import Lookahead, Prepared
from autoloop.engine.night import Night
from autoloop.engine.slot import Slot
from autoloop.engine.trial import Run, Trial, check_guard_names, measure_noise, run_baseline
from autoloop.execution.devices import placed_envs, slot_envs
from autoloop.execution.executors import make_executor
from autoloop.observe.console import Prefixed, plural, shorten
from autoloop.proposers.base import Proposer
from autoloop.proposers.preflight import run_preflight
from autoloop.repo.worktrees import ensure_worktree, remove_worktree, worker_workspace
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.store.state import RunState, StateFile, load_state
from autoloop.store.stop_request import take_request

JOIN_SLICE_S = 0.2     # the main thread joins the slots in slices: it must stay free to take signals


def _uses_agent(proposer: Proposer) -> bool:
    """The agent proposes here: alone, or as a member of a portfolio (which calls it too)."""
    return proposer.name == "agent" or "agent" in (getattr(proposer, "members", None) or {})


class Scheduler:
    def __init__(self, night: Night, proposer: Proposer):
        self.night, self.proposer = night, proposer
        self.n = night.settings.workers
        # One at a time only where every proposal is quick: a portfolio with an agent member
        # held the lock through each agent call, so its workers proposed in turn (minutes
        # each; benchmarks/portfolio_claims.py measures it).
        self.claims = Claims(one_at_a_time=not _uses_agent(proposer))
        self.reserved: dict[Claimant, int] = {}   # slot, look-ahead or prepared file -> trial in flight
        self.started = 0                           # trials started by this run (failed proposals included)
        self.failures = 0                          # failed proposals in a row, all slots together
        self.repeats = 0                           # duplicates in a row (the duplicate gate's skips)
        self.said_unreported = False               # "the agent's CLI reports no cost" said once
        self.exhausted = False
        self.reason: str | None = None
        self.requested: str | None = None          # a stop asked for from another shell (stop_request.py)
        self.error: BaseException | None = None
        self.deadline: float | None = None
        self.mono_deadline: float | None = None
        self._main: StateFile | None = None   # state.json, made when the run starts
        # Look-ahead (lookahead.py): propose the next trial while this one trains; by default
        # where proposing is slow (an agent), not where it takes milliseconds (the mutator, the queue).
        s = night.settings
        self.lookahead = bool(s.lookahead if s.lookahead is not None else _uses_agent(proposer))
        self.pending: list[Prepared] = []   # prepared by a run that stopped, not yet run
        self.taken_up: set[tuple[int, int]] = set()   # (trial, attempt) of records _pending_next gave out

    def run(self) -> str:
        """Run until a stop condition; returns the stop reason (also stored in state.json)."""
        night, s = self.night, self.night.settings
        if _uses_agent(self.proposer) and not s.skip_preflight:
            # Before the baseline and before this run's state is written: an agent that cannot
            # run is one line now, not a failed call after minutes of baseline, five times over.
            run_preflight(s, night.ws.root, night.console.line)
        check_guard_names(s, queries.baseline(night.arbiter.records()))   # a recorded baseline: before anything runs
        # Where the engine places the trial, it binds its devices: nothing computed here (devices.py).
        envs, devices = (placed_envs(s, self.n, night.executor.name) if night.executor.places_devices
                         else slot_envs(s, self.n))
        started = time.time()
        self.deadline = started + s.hours * 3600 if s.hours else None
        # Judged on the monotonic clock: a wall clock stepped back or forward (NTP, a suspended
        # laptop's resync) neither stretches nor cuts --hours; the wall deadline is for display.
        self.mono_deadline = time.monotonic() + s.hours * 3600 if s.hours else None
        self._main = StateFile(night.layout.root, state=RunState(
            tag=night.tag, pid=os.getpid(), run_started_at=started, deadline=self.deadline,
            workers=self.n if self.n > 1 else None))
        self.main.replace(self.main.state)
        until = f", until {time.strftime('%H:%M', time.localtime(self.deadline))}" if self.deadline else ""
        night.console.line(f"autoloop on {night.ws.branch_name(night.tag)}: "
                           + (f"{self.n} workers, " if self.n > 1 else "")
                           + f"proposer {self.proposer.name}, budget {format_duration(s.budget)}, timeout "
                           f"{format_duration(s.timeout_s)}{until}" + (f"; {devices}" if devices else ""))
        warm = night.memory.warm_line(self.proposer.name)
        if warm:
            night.console.line(warm)
        # A signal during the baseline or its noise runs ends the night there: with workers there
        # is no best to make their worktrees at (a Ctrl-C 3 s into the baseline was an internal error).
        reason = self._baseline() or self._signalled() or self._trials(envs)
        if not self.main.state.in_flight:   # an error mid-attempt leaves it for --resume to recover
            self.main.enter("stopped", stop_reason=reason, stopped_at=time.time())
        best, metric = night.arbiter.best()
        night.console.line(f"stopped: {reason}. best {'-' if metric is None else f'{metric:.6f}'} "
                           f"at {best[:7] if best else '-'}")
        weak = queries.under_powered_keeps(queries.of_night(night.arbiter.records()))
        if weak:
            night.console.line(f"under-powered keeps (confirmed on fewer runs than --power {s.verify_power:g} asked): "
                               + ", ".join(queries.under_powered_text(r, c) for r, c in weak))
        if self.error is not None:
            raise self.error
        return reason

    @property
    def main(self) -> StateFile:
        """state.json: the single loop's state file, and the run's (its stop reason)."""
        assert self._main is not None, "the scheduler's state file is made by run()"
        return self._main

    # -- the phases -----------------------------------------------------------------------

    def _baseline(self) -> str | None:
        """The baseline and its noise runs, in the main checkout, before any trial."""
        night = self.night
        reason = night.low_disk()
        if reason:
            return reason
        runner = AttemptRunner(night, Slot.main(night, self.main))
        if queries.baseline(night.arbiter.records()) is None:
            if self.mono_deadline is not None and time.monotonic() + self._expected() > self.mono_deadline:
                return "time is up: not even the baseline fits before the --hours deadline"
            run_baseline(night, runner)
            self._noise_runs(runner)
        elif night.settings.remeasure:
            self._noise_runs(runner)
        scout.measure_scout(night, runner)   # the scout rung's noise and reference (--scout)
        return None

    def _noise_runs(self, runner: AttemptRunner) -> None:
        """The noise samples of the best; with look-ahead the first trial is proposed
        meanwhile (the device busy while the proposer works), and left prepared in
        results/prepared/ for a slot to take first."""
        night = self.night
        ahead = None
        if self.lookahead and night.settings.noise_runs > 0 and not night.stop.is_set():
            ahead = Lookahead(night, runner.slot, self.proposer, self.claims)
            self._look_ahead(ahead, None)
        try:
            measure_noise(night, runner)
        finally:
            if ahead is not None:
                try:
                    if ahead.busy:
                        result = ahead.wait()
                        # A prepared one is taken again from its file by _trials (lookahead.pending).
                        self._release(ahead.key, result.outcome, counted=result.prepared is None)
                finally:
                    ahead.close()

    def _trials(self, envs: list[dict[str, str]]) -> str:
        night = self.night
        # Taken before any new trial (with or without --lookahead now): each runs once.
        self.pending = lookahead.pending(night)
        for prepared in self.pending:
            self.reserved[f"prepared-{prepared.trial}"] = prepared.trial
        slots = self._slots(envs)
        # Made here, one after the other: git does not add two worktrees at once.
        aheads = [Lookahead(night, slot, self.proposer, self.claims) if self.lookahead else None for slot in slots]
        threads = [threading.Thread(target=self._work, args=(slot, ahead), name=f"autoloop-slot-{slot.worker}",
                                    daemon=True)
                   for slot, ahead in zip(slots, aheads, strict=True)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=JOIN_SLICE_S)
        night.arbiter.publish()
        if self.n > 1:
            for slot in slots:
                slot.ws.close()
            self._remove_worktrees()
        # A signal ends the run even when a slot had found another reason first.
        return (self._signalled() if self.error is None else None) or self.reason or "stopped"

    def _signalled(self) -> str | None:
        """The stop reason of a signal (or a stop request) taken so far; None if none was."""
        stop = self.night.stop
        return f"stopped by {stop.signal or 'request'}" if stop.is_set() else None

    def _slots(self, envs: list[dict[str, str]]) -> list[Slot]:
        """One slot on the main checkout, or one per worker on its own worktree at the best."""
        night = self.night
        if self.n == 1:
            return [Slot.main(night, self.main)]
        best = night.arbiter.best()[0]
        assert best is not None, "workers start after the baseline"   # _baseline ran it
        slots = []
        for k in range(self.n):
            ensure_worktree(night.ws, k, night.tag, best)
            ws = worker_workspace(night.ws.root, k, night.tag, night.settings.target, night.layout.root)
            ws.reset_to(best)
            state = StateFile(night.layout.root, Layout.worker_state_name(k), self.main.state.model_copy(
                update={"workers": None}))
            slots.append(Slot(ws, state, k, make_executor(night.settings, night.ws.root), envs[k],
                              Prefixed(night.console, f"[w{k}]")))
        return slots

    def _remove_worktrees(self) -> None:
        """A clean stop: the worktrees go (a resume makes them again); what they held is in
        the ledger, the trial refs and results/. Kept after an error or with an attempt in
        flight, for --resume."""
        layout = self.night.layout
        if self.error is not None or any(load_state(layout.root, p.name).in_flight for _, p in layout.worker_states()):
            return
        for k in range(self.n):
            remove_worktree(self.night.ws, k, self.night.tag)
            layout.state(Layout.worker_state_name(k)).unlink(missing_ok=True)

    # -- one slot -------------------------------------------------------------------------

    def _work(self, slot: Slot, ahead: Lookahead | None) -> None:
        night, runner = self.night, AttemptRunner(self.night, slot)
        prepared: Prepared | None = None   # the next trial, proposed while the last one ran
        try:
            while True:
                with night.arbiter.lock:
                    # The prepared trial's reservation becomes this slot's (below), so it does not
                    # count twice toward --max-trials.
                    unfinished = None if prepared else self._pending_next()
                    if prepared is None and unfinished is None and self.pending:
                        prepared = self.pending.pop(0)
                        self.reserved.pop(f"prepared-{prepared.trial}", None)
                    elif prepared is not None and ahead is not None:   # prepared by ahead, last round
                        self.reserved.pop(ahead.key, None)
                        self.claims.release(ahead.key)
                    reason = self.stop_reason(prepared=prepared is not None)
                    if reason:   # a prepared candidate stays in results/prepared/: --resume runs it
                        self.reason = self.reason or reason
                        return
                    trial = (unfinished.trial if unfinished else prepared.trial if prepared else
                             self._next_trial())
                    self.reserved[slot.worker] = trial
                    parent = night.arbiter.best()
                if parent[0] and slot.ws.head() != parent[0]:
                    slot.ws.reset_to(parent[0])   # always propose on the current best
                outcome = "failed"
                try:
                    this = Trial(night, slot, runner, self.proposer, trial, parent, self.claims)
                    outcome = (this.resume(unfinished) if unfinished else
                               self._run_trial(this, ahead, prepared, parent))
                finally:
                    self._release(slot.worker, outcome)
                    if prepared is not None:
                        lookahead.done(night.layout, prepared.trial)
                prepared = None
                if ahead is not None and ahead.busy:
                    result = ahead.wait()
                    prepared = result.prepared
                    if prepared is None:
                        self._release(ahead.key, result.outcome)
        except BaseException as e:   # handed to the main thread, which reports it
            self._fail(e)
        finally:
            if ahead is not None:
                ahead.close()

    def _run_trial(self, this: Trial, ahead: Lookahead | None, prepared: Prepared | None,
                   parent: queries.Best) -> str:
        """One trial from its first step on; a slot that looks ahead starts proposing the
        next one as soon as this one has its candidate."""
        first: Candidate | None = None
        if prepared is not None:
            rebased = lookahead.rebase(self.night, this.slot, prepared, parent)
            if isinstance(rebased, lookahead.Dropped):   # recorded: the next trial asks the proposer afresh
                return rebased.outcome
            first = rebased
            self.claims.claim(this.slot.worker, {"parent": parent[0], "kind": "candidate", "trial": this.number,
                                                 "description": first.description, "worker": this.slot.worker})
        step = this.begin(first)
        if ahead is not None and isinstance(step, Run):
            self._look_ahead(ahead, step.plan.candidate)
        return this.finish(step)

    def _look_ahead(self, ahead: Lookahead, running: Candidate | None) -> None:
        with self.night.arbiter.lock:
            # The agent call that made the running candidate is in no record until it ends:
            # counted now, or a look-ahead call would go past --max-agent-cost by one.
            usage = running.extra.get("agent_usage") if running is not None else None
            if self.stop_reason(ahead=True) or self._agent_cost(usage):
                return
            trial = self._next_trial()
            self.reserved[ahead.key] = trial
            best = self.night.arbiter.best()
        ahead.start(trial, best)

    def _next_trial(self) -> int:
        """A trial number no record and no reservation has (callers hold the arbiter's lock)."""
        return max([queries.next_trial(self.night.arbiter.records()), *(t + 1 for t in self.reserved.values())])

    def _pending_next(self) -> LedgerRecord | None:
        """A confirmation or replay decided but never run (a kill or a stop came between), not
        taken by another slot: run before any new trial (callers hold the arbiter's lock)."""
        taken, records = set(self.reserved.values()), self.night.arbiter.records()
        pending = queries.pending_next(records)
        if self.night.settings.rerun_interrupted:   # an attempt a kill cut off while training
            pending += queries.pending_reruns(records)
        # Each is taken up once a run: one that ran nothing (no decision to take up) would
        # otherwise be found again and again, each time counted as a trial, until --max-trials.
        found = next((r for r in pending if r.trial not in taken and (r.trial, r.attempt) not in self.taken_up), None)
        if found is not None:
            self.taken_up.add((found.trial, found.attempt))
        return found

    def _release(self, worker: Claimant, outcome: str, counted: bool = True) -> None:
        with self.night.arbiter.lock:
            self.reserved.pop(worker, None)
            self.claims.release(worker)
            if not counted:
                return
            if outcome == "exhausted":
                self.exhausted = True
                return
            if outcome == "duplicate":
                # Told in the next prompt, a repeat is forgiven once; repeated again, it is a
                # failure like any other (and stops a proposer that cannot stop repeating).
                self.repeats += 1
                self.failures += self.repeats > 1
            elif outcome == "failed":
                self.repeats = 0
                self.failures += 1
            else:
                self.repeats = self.failures = 0
            self.started += 1   # a failed proposal (a skip) counts toward --max-trials too: an agent call was made

    def _fail(self, error: BaseException) -> None:
        with self.night.arbiter.lock:
            self.error = self.error or error
            self.reason = self.reason or f"{'a worker' if self.n > 1 else 'the loop'} failed: {error}"
        self.night.stop.event.set()   # the other slots' trials end now, recorded as interrupted

    # -- when to stop ---------------------------------------------------------------------

    def stop_reason(self, ahead: bool = False, prepared: bool = False) -> str | None:
        """Why no further trial may start, or None (callers hold the arbiter's lock).
        ``ahead``: for a look-ahead proposal, whose trial starts after the one running now;
        ``prepared``: for a trial proposed already and counted when it was reserved: only a
        stop, a full disk or the deadline keep it from running (then --resume runs it)."""
        night, s = self.night, self.night.settings
        if night.stop.is_set() or self.error is not None:
            return self.reason or f"stopped by {night.stop.signal or 'request'}"
        # Asked from another shell (autoloop mcp's stop_after_trial): no new trial, in any slot.
        self.requested = self.requested or take_request(night.layout.root, os.getpid())
        if self.requested:
            return self.requested
        if prepared:
            return night.low_disk() or self._past_deadline(1)
        if self.reason:
            return self.reason
        if self.exhausted:
            return f"proposer '{self.proposer.name}' has no more ideas"
        if s.max_trials is not None and self.started + len(self.reserved) >= s.max_trials:
            return f"reached --max-trials {s.max_trials}"
        # An agent has a limit of its own (its failures are slow and cost money).
        limit, flag = ((s.max_agent_failures, "--max-agent-failures") if self.proposer.name == "agent"
                       else (s.max_proposer_failures, "--max-proposer-failures"))
        ended = queries.ended_in_a_row(night.arbiter.records())
        if ended >= s.max_cluster_ends:
            last = night.arbiter.records()[-1].reason
            return (f"the cluster ended {plural(ended, 'trial')} in a row (preempted, node failure, lost, queue limit; "
                    f"--max-cluster-ends {s.max_cluster_ends}): the night stops rather than burn the queue; "
                    f"last: {shorten(last)}")
        if self.failures >= limit:
            records = night.arbiter.records()
            why = f"; last: {shorten(records[-1].reason)}" if records and records[-1].reason else ""
            return f"{self.proposer.name} failed {plural(self.failures, 'time')} in a row ({flag} {limit}){why}"
        return self._agent_cost() or night.low_disk() or self._past_deadline(2 if ahead else 1)

    def _past_deadline(self, trials: int) -> str | None:
        """The deadline for ``trials`` more trials (and --verify-at-end's runs after them)."""
        if self.mono_deadline is not None and (time.monotonic() + self._expected() * trials
                                               + self._kept_for_verification() > self.mono_deadline):
            if self.night.settings.verify_at_end:
                return "time is up: the rest of --hours is kept for the verification (--verify-at-end)"
            return "time is up: the next trial could not finish before the --hours deadline"
        return None

    def _agent_cost(self, unrecorded: dict[str, Any] | None = None) -> str | None:
        """--max-agent-cost against what the agent's CLI reported (queries.agent_spend), and
        ``unrecorded``, the usage of a call whose record is not written yet (the trial running
        now); calls that reported no cost are said once, never estimated."""
        s = self.night.settings
        if not _uses_agent(self.proposer):
            return None
        spend = queries.agent_spend(self.night.arbiter.records())
        if unrecorded and unrecorded.get("cost_usd") is not None:
            spend = replace(spend, calls=spend.calls + 1, cost_usd=spend.cost_usd + unrecorded["cost_usd"])
        silent = spend.unreported + spend.without_cost
        if silent and not self.said_unreported:
            self.said_unreported = True
            what = "no usage at all" if spend.unreported else "tokens but no cost"
            self.night.console.line(
                f"agent cost: {silent} of {plural(spend.calls, 'call')} reported {what} (its CLI printed none; "
                "Claude Code reports it with --output-format json, Aider always); nothing is estimated"
                + ("; --max-agent-cost counts only what was reported" if s.max_agent_cost is not None else ""))
        if s.max_agent_cost is not None and spend.cost_usd >= s.max_agent_cost:
            return (f"the agent calls cost ${spend.cost_usd:.2f} as reported, reaching --max-agent-cost "
                    f"${s.max_agent_cost:.2f} ({plural(spend.calls, 'call')})")
        return None

    def _expected(self) -> float:
        return queries.typical_attempt_seconds(self.night.arbiter.records(), self.night.settings.budget + 30)

    def _kept_for_verification(self) -> float:
        """--verify-at-end: the time its runs will take if the next trial is kept too."""
        s = self.night.settings
        if not s.verify_at_end:
            return 0.0
        records = self.night.arbiter.records()
        kept = sum(1 for r in records if queries.is_kept_change(r)) + 1
        repeats, _ = queries.verify_repeats(records, s.verify_repeats, s.verify_power)
        return expected_seconds(kept, repeats, self._expected(), s.verify_scale, s.budget, s.verify_budget)
