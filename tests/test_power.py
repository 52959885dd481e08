"""How many repeats a verification runs: from the night's noise and its smallest kept gain,
for the power asked (core/power.py), and which kept changes the count leaves under-powered."""

from __future__ import annotations

import pytest

from autoloop.core.power import MAX_REPEATS, chosen_repeats, power_of, repeats_for
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.verification.verify_plan import Plan, summarize, summary_lines, under_powered


@pytest.mark.parametrize("gain_in_sigmas, repeats", [(1.0, 16), (2.3, 3), (3.0, 2), (0.5, 63), (10.0, 2)])
def test_the_repeats_a_gain_needs_for_80_percent_power(gain_in_sigmas, repeats):
    # R >= 2 (z_0.975 + z_0.8)^2 (sigma / gain)^2 = 15.7 (sigma / gain)^2, at least two.
    assert repeats_for(gain_in_sigmas * 0.003, 0.003, 0.8) == repeats
    if repeats > 2:
        assert power_of(gain_in_sigmas * 0.003, 0.003, repeats) >= 0.8 > power_of(gain_in_sigmas * 0.003, 0.003,
                                                                                    repeats - 1)


def test_the_count_is_the_smallest_gains_capped_and_says_why():
    n, why = chosen_repeats([0.01, 0.004], 0.002, 0.8)
    assert (n, why) == (4, "4 repeats from power: the smallest kept gain 0.004 at the night's σ 0.002 needs 4 for "
                           "80% power at a two-sided 5%")
    n, why = chosen_repeats([0.001], 0.002, 0.8)
    assert n == MAX_REPEATS and why.endswith(f"capped at {MAX_REPEATS} (it needs 63)")
    n, why = chosen_repeats([0.01], None, 0.8)
    assert n == 3 and why.startswith("3 repeats: no noise measured this night")


def _rec(trial: int, metric: float, **kw) -> LedgerRecord:
    fields = dict(trial=trial, attempt=1, started_at=float(trial), ended_at=trial + 1.0, proposer="queue",
                  description="x", status="keep", kind="candidate", metric=metric, commit=f"c{trial}" * 5,
                  parent=f"c{trial - 1}" * 5, best=f"c{trial}" * 5, best_metric=metric)
    fields.update(kw)
    return LedgerRecord(**fields)


def test_a_ledger_gives_its_kept_gains_and_the_verifications_count():
    records = [_rec(0, 1.0, kind="baseline", parent=None, noise=0.002, extra={"noise_method": "baseline repeats"}),
               _rec(1, 0.99), _rec(2, 0.988, status="discard", best="c1" * 5, best_metric=0.99), _rec(3, 0.985)]
    assert queries.kept_gains(records) == pytest.approx({1: 0.01, 3: 0.005})
    assert queries.verify_repeats(records, None, 0.8)[0] == 3          # 0.005 at σ 0.002: 2.5 σ
    assert queries.verify_repeats(records, None, 0.95)[0] == 5         # more power, more repeats
    assert queries.verify_repeats(records, 7, 0.8) == (7, "7 repeats (--repeats)")


def test_the_kept_changes_the_repeats_leave_under_powered_are_named():
    plan = Plan(tag="t", best="b" * 40, best_metric=0.9, baseline="a" * 40, direction="min", repeats=5, seeds=[1],
                power=0.8, sigma=0.002, gains={"1": 0.01, "2": 0.001})
    assert [(t, n) for t, _, _, n in under_powered(plan)] == [(2, 63)]
    assert under_powered(plan.model_copy(update={"sigma": None})) == []
    lines = summary_lines(summarize(plan, []))
    assert "under-powered at 5 repeats (σ 0.002, 80% power asked): #2 (gain 0.001: power 12%, needs 63)" in lines
    from autoloop.review.report import verification_section

    section = "\n".join(verification_section(summarize(plan, []), None))
    assert "**Under-powered** at 5 repeats (the night's σ 0.002; 80% power asked at a two-sided 5%): #2 (its gain " \
           "0.001 is seen with power 12%; it needs 63 repeats)" in section
