"""The scout rung's pure rules (core/scout.py), its keep rows, and its ledger field."""

from __future__ import annotations

import json
import math

import pytest

from autoloop.core.keep import Facts, decide
from autoloop.core.scout import (
    MARGIN_Z,
    MIN_PAIRS,
    ScoutRef,
    agreement,
    judge_scout,
    margin,
    pooled_sigma,
    spearman,
    switched_off,
)
from autoloop.store.ledger import LedgerRecord
from autoloop.store.scout import scout_pairs


def test_spearman_ranks_ties_and_degenerate_input():
    assert spearman([(1, 10), (2, 20), (3, 30), (4, 40)]) == pytest.approx(1.0)
    assert spearman([(1, 40), (2, 30), (3, 20), (4, 10)]) == pytest.approx(-1.0)
    # ties share their mean rank: ranks (1.5, 1.5, 3) vs (1, 2, 3)
    assert spearman([(1, 1), (1, 2), (2, 3)]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([(1, 1), (2, 2)]) is None                 # too few
    assert spearman([(1, 5), (2, 5), (3, 5)]) is None         # one rung all equal


def test_pooled_sigma_over_commits_with_repeats():
    assert pooled_sigma([[1.0], [2.0]]) is None
    assert pooled_sigma([[1.0, 3.0]]) == pytest.approx(math.sqrt(2))
    # (1, 3): ss 2, dof 1; (0, 0, 3): ss 6, dof 2 -> sqrt(8 / 3)
    assert pooled_sigma([[1.0, 3.0], [0.0, 0.0, 3.0], [7.0]]) == pytest.approx(math.sqrt(8 / 3))


def test_the_margin_comes_from_the_scout_noise():
    assert margin(None, 2.0, 1) is None
    assert margin(0.01, 2.0, 1) == pytest.approx(2 * 0.01 * math.sqrt(2))
    worse = 5.0 + 0.01   # a candidate 0.01 worse than the best's scout result 5.0 (lower is better)
    quiet, noisy = ScoutRef((5.0,), 0.001), ScoutRef((5.0,), 0.1)
    assert not judge_scout(worse, quiet, "min").promote
    assert judge_scout(worse, noisy, "min").promote
    assert judge_scout(4.9, quiet, "min").promote              # better than the best: always promoted
    assert not judge_scout(4.9, quiet, "max").promote          # ... in its direction
    assert judge_scout(9.0, ScoutRef(), "min").promote         # no reference yet: nothing to judge by
    verdict = judge_scout(worse, quiet, "min")
    assert verdict.reason.startswith("scouted out: 5.010000 vs the best's scout 5.000000")
    assert verdict.margin == pytest.approx(MARGIN_Z * 0.001 * math.sqrt(2))


def test_a_scout_run_is_never_a_keep():
    best = ("b" * 40, 4.0)
    ref = ScoutRef((5.0, 5.002), 0.001)
    out = decide(Facts(kind="scout", commit="c" * 40, runs=(6.0,), parent=best, current=best, scout=ref))
    assert (out.status, out.action, out.best) == ("discard", "discard", best)
    assert out.extra["scout"]["promoted"] is False
    win = decide(Facts(kind="scout", commit="c" * 40, runs=(1.0,), parent=best, current=best, scout=ref))
    assert (win.status, win.action, win.best) == ("discard", "promote", best)
    sample = decide(Facts(kind="scout", commit=best[0], runs=(5.0,), parent=best, current=best, scout=ref))
    assert (sample.status, sample.action, sample.extra) == ("discard", "discard", {"scout_sample": True})
    crashed = decide(Facts(kind="scout", commit="c" * 40, crash=("trivial", "NameError"), parent=best, current=best))
    assert (crashed.status, crashed.action) == ("crash", "discard")


def test_scouting_switches_off_once_and_stays_off():
    agree = [(float(k), float(k) + 0.5) for k in range(MIN_PAIRS + 4)]
    assert switched_off(agree) is None
    reverse = [(float(k), -float(k)) for k in range(MIN_PAIRS)]
    off = switched_off(reverse)
    assert off is not None and off.pairs == MIN_PAIRS and off.rho == pytest.approx(-1.0)
    assert switched_off(reverse[:-1]) is None                  # not before MIN_PAIRS pairs
    # pairs that agree again later (a resumed night) do not turn it back on
    assert switched_off(reverse + agree * 3) == off
    assert agreement(agree).predicting


def _record(**fields) -> LedgerRecord:
    base = {"trial": 1, "started_at": 0.0, "ended_at": 1.0, "proposer": "queue", "description": "d",
            "status": "discard"}
    return LedgerRecord.model_validate({**base, **fields})


def test_old_ledgers_read_as_full_and_pairs_follow_promotions():
    old = json.loads(_record().model_dump_json())
    del old["fidelity"]
    assert LedgerRecord.model_validate(old).fidelity == "full"
    records = [
        _record(trial=1, kind="scout", fidelity="scout", commit="a", metric=5.0, extra={"scout": {"promoted": True}}),
        _record(trial=2, kind="scout", fidelity="scout", commit="b", metric=6.0, extra={"scout": {"promoted": False}}),
        _record(trial=1, attempt=2, kind="candidate", commit="a", metric=4.0),
        _record(trial=3, kind="candidate", commit="c", metric=3.0),   # scouting was off: no pair
    ]
    assert scout_pairs(records) == [(5.0, 4.0)]
