"""What each trial of a ledger came to: who proposed it, the value judged, the gain it made, its time.

Pure functions over ledger records, built on :mod:`autoloop.store.queries` (the best in force
before each record, what a noise sample is), shared by the Optuna proposer (the value it tells the
study), the portfolio (the bandit's evidence) and the morning report (yield per proposer).
The ledger is the truth, so all three agree and all survive a restart.

A trial's *value* is its judged metric: the mean of the runs of the commit it was judged on
(the candidate's first run and any confirmation re-run of the same commit; a fixed trial's
last fix). A re-run of a candidate merged onto a new best (a parallel worker's replay) is
another commit and not part of it. Its *gain* is how much it moved the best: the sum, over
its kept attempts, of the best before minus the best after (positive = better, whatever the
direction). Its *seconds* are the night it used: each attempt from start to end, plus the
proposing time where the portfolio recorded it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Literal

from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord

Status = Literal["measured", "crash", "interrupted", "skip", "pruned"]

# How the portfolio words a failed proposal (the skip's reason): which member it chose, why,
# and how long the member took to fail. The choice itself travels in the skip's
# extra.portfolio, as a proposal's does; ledgers written before it have only this reason, read
# back by the pattern so that a resumed night charges the right member (_OLD_PORTFOLIO_SKIP).
_OLD_PORTFOLIO_SKIP = re.compile(r"^portfolio chose (?P<member>[\w-]+) .*?; it failed after (?P<seconds>[\d.]+) s: ")


def portfolio_skip_reason(member: str, why: str, seconds: float, failure: str) -> str:
    """The reason of a skip the portfolio caused (the person's; the choice is in its extra)."""
    return f"portfolio chose {member} ({why}); it failed after {seconds:.1f} s: {failure}"


def portfolio_choice(member: str, why: str, seconds: float) -> dict[str, Any]:
    """extra.portfolio: whose the proposal was, why, and the member's time (a failed one's to
    the tenth of a second, as its skip's reason says it)."""
    return {"choice": member, "reason": why, "propose_s": seconds}


@dataclass
class TrialResult:
    trial: int
    proposer: str              # who proposed it: the portfolio's choice, else the record's proposer
    kind: str                  # baseline | candidate
    status: Status             # measured (it has a value), crash, interrupted, skip, pruned (stopped behind the best)
    commit: str | None         # the commit judged (None when nothing was committed)
    value: float | None        # the judged metric (the mean of that commit's runs)
    runs: int                  # how many runs the value is the mean of
    kept: bool
    gain: float                # improvement of the best it made, >= 0 for a keep
    seconds: float             # night time used: its attempts, plus its proposing time when recorded
    reason: str                # the last attempt's reason
    first: LedgerRecord        # its first attempt (where the proposer's own fields are)
    # --scout: measured at the scout budget alone (scouted out), so its value is on another
    # scale than the full-budget values around it: worse-looking than the change would be.
    scouted_out: bool = False


def record_proposer(record: LedgerRecord) -> str:
    """The proposer of one attempt: the portfolio's member when the portfolio chose."""
    chosen = record.extra.get("portfolio")
    choice = chosen.get("choice") if isinstance(chosen, dict) else None
    if isinstance(choice, str):
        return choice
    if record.status == "skip":   # a ledger written before the choice was in a skip's extra
        m = _OLD_PORTFOLIO_SKIP.match(record.reason or "")
        if m:
            return m["member"]
    return record.proposer


def trial_outcomes(records: list[LedgerRecord], direction: str = "min") -> dict[int, TrialResult]:
    """Trial number -> its outcome, for every trial of the night (the baseline's included;
    `autoloop verify`'s trials are measurements, not proposals: left out)."""
    by_trial: dict[int, list[tuple[LedgerRecord, float | None]]] = {}
    records = queries.of_night(records)
    # In ledger order, with the best in force when each was judged.
    for r, before in zip(records, queries.best_before(records), strict=True):
        by_trial.setdefault(r.trial, []).append((r, before))
    return {trial: _outcome(trial, attempts, direction) for trial, attempts in by_trial.items()}


def _outcome(trial: int, attempts: list[tuple[LedgerRecord, float | None]], direction: str) -> TrialResult:
    records = [r for r, _ in attempts]
    first, last = records[0], records[-1]
    proposals = [r for r in records if r.kind != "confirm"]
    judged = proposals[-1] if proposals else first
    commit = judged.commit
    measured = [r for r in records
                if r.commit == commit and commit and r.metric is not None and r.status in ("keep", "discard")
                and not r.extra.get("replay_of")]
    # --scout: a promoted trial's value is its full-budget runs'; a scouted-out one has only its scout run.
    full = [r.metric for r in measured if r.kind != "scout" and r.metric is not None]
    runs = full or [r.metric for r in measured if r.metric is not None]
    gain = 0.0
    for r, before in attempts:
        if r.status == "keep" and r.kind != "baseline" and not queries.is_noise_sample(r) \
                and before is not None and r.best_metric is not None:
            gain += (before - r.best_metric) if direction == "min" else (r.best_metric - before)
    if first.status == "skip" and not runs:
        status: Status = "skip"
    elif runs:
        status = "measured"
    elif any(r.status == "pruned" for r in records):
        status = "pruned"
    elif any(queries.was_interrupted(r) for r in records):
        status = "interrupted"
    else:
        status = "crash"
    seconds = sum(queries.attempt_seconds(r) for r in records)
    chosen = first.extra.get("portfolio")
    if isinstance(chosen, dict) and isinstance(chosen.get("propose_s"), (int, float)):
        seconds += chosen["propose_s"]
    elif first.status == "skip":   # a ledger written before the choice was in a skip's extra
        m = _OLD_PORTFOLIO_SKIP.match(first.reason or "")
        if m:
            seconds += float(m["seconds"])
    return TrialResult(
        trial=trial, proposer=record_proposer(first), kind=first.kind, status=status, commit=commit,
        value=fmean(runs) if runs else None, runs=len(runs),
        kept=any(r.status == "keep" and not queries.is_noise_sample(r) for r in records),
        gain=gain, seconds=seconds, reason=last.reason or "", first=first, scouted_out=bool(runs) and not full)


@dataclass
class Yield:
    """What one proposer brought to a night."""

    trials: int = 0            # trials it proposed (failed proposals included)
    failed: int = 0            # proposals that failed before anything ran
    keeps: int = 0             # trials that moved the best
    gain: float = 0.0          # total improvement of the best, >= 0
    seconds: float = 0.0       # night time it used


def proposer_yields(records: list[LedgerRecord], direction: str = "min") -> dict[str, Yield]:
    """Proposer name -> its yield, in the order the proposers first appear (baseline excluded)."""
    out: dict[str, Yield] = {}
    for o in trial_outcomes(records, direction).values():
        if o.kind == "baseline":
            continue
        y = out.setdefault(o.proposer, Yield())
        y.trials += 1
        y.failed += o.status == "skip"
        y.keeps += o.kept
        y.gain += o.gain
        y.seconds += o.seconds
    return out
