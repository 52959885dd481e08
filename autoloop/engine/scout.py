"""The scout rung in the night (--scout; the rules: core/scout.py, docs/fidelity.md).

Whether a proposal is scouted first (``active``: --scout set and the rung still predicting
the full one), the scout runs of the best that give the rung its noise and its reference
(``measure_scout``: at start, and after each keep), and the one line said when the rung
stops predicting. Everything is read from the ledger, so a resumed night scouts, or does
not, as the killed one would have.
"""

from __future__ import annotations

import threading

from autoloop.core.scout import switched_off
from autoloop.engine.attempt import AttemptPlan, AttemptRunner
from autoloop.engine.candidate import Candidate
from autoloop.engine.night import Night
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.store.scout import scout_pairs, scout_runs

# Parallel slots that find the best without scout runs at once run them once.
_measuring = threading.Lock()


def active(night: Night) -> bool:
    """Scout this proposal first: --scout is set and the rung has not been switched off."""
    return night.settings.scout is not None and switched_off(scout_pairs(night.arbiter.records())) is None


def samples_wanted(night: Night) -> int:
    """Scout runs of the best at start: as many as the full rung's noise estimate has, two at least."""
    return max(2, night.settings.noise_runs + 1)


def measure_scout(night: Night, runner: AttemptRunner, wanted: int | None = None) -> None:
    """Scout runs of the best until it has ``wanted`` (default: samples_wanted), as attempts
    of the trial that made it the best, with new seeds: the rung's noise and reference."""
    if not active(night):
        return
    with _measuring:
        records = night.arbiter.records()
        best, best_metric = queries.best(records)
        owner = queries.best_record(records)
        have = scout_runs(records, best)
        n = samples_wanted(night) if wanted is None else wanted
        if best is None or owner is None or len(have) >= n:
            return
        attempt = queries.next_attempt(records, owner.trial) - 1
        for k in range(len(have) + 1, n + 1):
            if night.stop.is_set():
                return
            attempt += 1
            candidate = Candidate(commit=best, parent=best, parent_metric=best_metric,
                                  description=f"scout sample {k}/{n} of the best", proposer="-")
            runner.run(AttemptPlan(owner.trial, attempt, "scout", candidate, night.settings.seed + 100 + k,
                                   can_confirm=False))


# Scout samples of each new best: its reference (two: the mean halves the reference's own
# noise in the margin; the promoting run is no reference, store/scout.py says why).
SAMPLES_AFTER_KEEP = 2


def after_keep(night: Night, runner: AttemptRunner, record: LedgerRecord) -> None:
    """Fresh scout samples of a new best, so the next scout results have an unbiased reference."""
    if record.status == "keep" and record.commit and record.commit == night.arbiter.best()[0]:
        measure_scout(night, runner, wanted=SAMPLES_AFTER_KEEP)


def say_if_switched_off(night: Night, record: LedgerRecord) -> None:
    """The one line, said when the full run that completed the deciding pair is recorded."""
    if night.settings.scout is None or record.fidelity != "full" or "scouted" not in record.extra:
        return   # only a promoted candidate's full run completes a pair
    pairs = scout_pairs(night.arbiter.records())
    off = switched_off(pairs)
    if off is not None and off.pairs == len(pairs):
        night.console.line(f"scouting off: the scout rung stopped predicting the full one ({off.line()}); "
                           "every proposal gets the full budget from now on")
