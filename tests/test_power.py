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


# ---------------------------------------------------------------------------------------------
# The keep rule's confirmation: how many runs a within-noise gain is judged on.

import random  # noqa: E402
import statistics  # noqa: E402

from autoloop.core.judge import judge_runs  # noqa: E402
from autoloop.core.keep import Facts, Rules, decide  # noqa: E402
from autoloop.core.power import MAX_CONFIRMATIONS, ConfirmCount, confirm_runs, keep_power  # noqa: E402


def test_the_keep_power_holds_the_bests_own_runs_in_the_variance():
    """Drawn: a candidate's mean of n runs against a best that is the mean of m runs, both with
    spread σ, kept when the difference clears the keep rule's bar z·σ/√n. The formula's power
    is what the draws give; leaving the best's error out would promise more than they give."""
    rng, sigma, gain, n, m = random.Random(7), 0.002, 0.003, 3, 3
    draws = 20000
    kept = sum(statistics.fmean(rng.gauss(gain, sigma) for _ in range(n))
               - statistics.fmean(rng.gauss(0.0, sigma) for _ in range(m)) > 2 * sigma / n ** 0.5
               for _ in range(draws))
    assert keep_power(gain, sigma, n, m, 2.0) == pytest.approx(kept / draws, abs=0.015)
    as_if_the_best_were_exact = keep_power(gain, sigma, n, 10 ** 9, 2.0)
    assert as_if_the_best_were_exact > kept / draws + 0.05


@pytest.mark.parametrize("gain_in_sigmas, best_runs, runs, needs", [
    (2.0, 3, 3, 3),       # the largest within-noise gain: one re-run is not enough against a best of 3 runs
    (1.8, 3, 4, 4),
    (1.5, 3, 4, 6),       # capped: 1 + MAX_CONFIRMATIONS
    (1.0, 3, 4, 18),
    (0.3, 1, 4, None),    # no count reaches 80 %: the best's one run limits it (Φ(0.3) < 0.8)
])
def test_the_runs_a_within_noise_gain_is_confirmed_with(gain_in_sigmas, best_runs, runs, needs):
    c = confirm_runs(gain_in_sigmas * 0.002, 0.002, best_runs, 0.8, 2.0)
    assert (c.runs, c.needs) == (runs, needs) and c.runs <= 1 + MAX_CONFIRMATIONS
    if needs is not None:   # the fewest that reach the power asked
        assert keep_power(c.gain, 0.002, needs, best_runs, 2.0) >= 0.8 > keep_power(c.gain, 0.002, needs - 1,
                                                                                       best_runs, 2.0)
    assert c.under_powered == (needs is None or needs > runs)
    assert c.power == pytest.approx(keep_power(c.gain, 0.002, runs, best_runs, 2.0))
    assert ConfirmCount.of(c.as_dict()) == c and ConfirmCount.of({"runs": 2}) is None


def test_the_reason_says_the_count_and_the_power():
    full = confirm_runs(0.004, 0.002, 3, 0.8, 2.0)
    assert full.text() == ("confirming with 2 more runs (3 runs for 80% power to keep a gain of 0.004 at σ 0.002 "
                           "against a best of 3 runs)")
    capped = confirm_runs(0.0021, 0.002, 3, 0.8, 2.0)
    assert capped.text() == ("confirming with 3 more runs (4 runs give 53% power to keep a gain of 0.0021 at σ 0.002 "
                             "against a best of 3 runs; 80% needs 15, capped at 3 more)")
    assert confirm_runs(0.0006, 0.002, 1, 0.8, 2.0).text().endswith("no count reaches 80%, capped at 3 more)")
    # More power asked, more runs (below the cap).
    assert confirm_runs(0.0038, 0.002, 5, 0.9, 2.0).runs > confirm_runs(0.0038, 0.002, 5, 0.8, 2.0).runs


def test_a_first_run_within_noise_asks_for_the_count_and_without_noise_one_rerun():
    j = judge_runs([0.9964], 1.0, "min", noise=0.002, z=2.0, power=0.8, best_runs=3)
    assert j.status == "confirm" and j.count is not None and (j.count.runs, j.count.needs) == (4, 4)
    assert j.reason.startswith("within noise (0.0036 <= 2 x noise 0.0020): confirming with 3 more runs (4 runs for "
                               "80% power")
    # No noise measured (the noise rule on min_delta alone): one re-run, as before the count, said so.
    j = judge_runs([0.999], 1.0, "min", 0.002, noise=None, rule="noise", power=0.8)
    assert j.status == "confirm" and j.count is None
    assert j.reason.endswith("confirming with a re-run (no noise measured: one re-run, not a count from --power)")
    # Without power asked: the single re-run of before.
    assert judge_runs([0.9964], 1.0, "min", noise=0.002, z=2.0).reason.endswith("confirming with a re-run")


def test_a_confirmation_is_judged_once_on_the_mean_of_all_its_runs():
    kw = dict(noise=0.002, z=2.0, can_confirm=False, power=0.8, best_runs=3, planned=4)
    # Before the last run: never kept, even when the mean so far clears the bar (2σ/√2 = 0.0028).
    j = judge_runs([0.997, 0.995], 1.0, "min", **kw)
    assert j.status == "confirm" and j.delta == pytest.approx(0.004)
    assert j.reason == "mean of 2 runs improves by 0.0040: 2 of 4 runs, confirming on (judged once, on the mean of all)"
    # ... stopped only where the mean is no better than the best: that can only lose keeps.
    j = judge_runs([0.998, 1.003], 1.0, "min", **kw)
    assert j.status == "discard" and j.reason.endswith("no better than the best 1.0000; stopped at 2 of 4 runs)")
    # At the last run: the mean of all four against the bar for four (2σ/√4 = 0.002).
    assert judge_runs([0.997, 0.997, 0.998, 0.998], 1.0, "min", **kw).status == "keep"
    j = judge_runs([0.998, 0.999, 0.998, 0.999], 1.0, "min", **kw)
    assert j.status == "discard" and j.reason.startswith("within noise (mean of 4 runs improves by 0.0015")


def test_the_decision_carries_the_count_and_the_ledger_names_the_under_powered_keeps():
    a, b = "a" * 40, "b" * 40
    first = decide(Facts(kind="candidate", commit=b, runs=(0.9964,), parent=(a, 1.0), current=(a, 1.0), noise=0.002,
                         best_runs=3, rules=Rules(keep_rule="noise")))
    assert first.action == "confirm" and first.confirmation is not None and first.confirmation.runs == 4
    assert first.extra["confirmation"] == first.confirmation.as_dict()
    capped = confirm_runs(0.0021, 0.002, 3, 0.8, 2.0)
    last = decide(Facts(kind="confirm", commit=b, runs=(0.9979, 0.996, 0.997, 0.997), parent=(a, 1.0),
                        current=(a, 1.0), noise=0.002, best_runs=3, can_confirm=False, confirmation=capped,
                        rules=Rules(keep_rule="noise")))
    assert (last.status, last.confirmation) == ("keep", None) and last.extra["confirmation"] == capped.as_dict()
    kept = _rec(1, 0.996, extra={"confirmation": capped.as_dict()})
    sure = _rec(2, 0.99, extra={"confirmation": first.confirmation.as_dict()})
    lost = _rec(3, 0.999, status="discard", extra={"confirmation": capped.as_dict()})
    records = [_rec(0, 1.0, kind="baseline", parent=None), kept, sure, lost]
    assert queries.under_powered_keeps(records) == [(kept, capped)]
    assert queries.under_powered_text(kept, capped) == (
        "#1 (kept on 4 runs: power 53% for its first run's gain 0.0021 at σ 0.002; 80% needs 15)")
    from autoloop.review.report import kept_changes, kept_section

    section = "\n".join(kept_section(kept_changes(records), "val_bpb"))
    assert "**Under-powered**: kept on fewer runs than `--power` asked for" in section
    assert "#1 (kept on 4 runs: power 53%" in section and "#2 (" not in section
