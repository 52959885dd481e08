"""core/prune.py's pure rules: the best's curve, the curve noise, the band, the watch, the switch-off."""

from __future__ import annotations

import math

import pytest

from autoloop.core.prune import (
    CONFIRM_LINES,
    MIN_BAND,
    PruneRef,
    Watch,
    curve_noise,
    judge_point,
    loss_at,
    mean_curve,
    partial_gap,
    rule_off,
    thin,
)
from autoloop.core.scout import MIN_PAIRS
from autoloop.store.ledger import LedgerRecord
from autoloop.store.prune import pairs, pruning, saved_seconds

BEST = tuple((float(t), 4.0 - 0.2 * t) for t in range(11))   # 10 s budget, one point a second


def test_loss_at_interpolates_between_points_and_says_none_outside():
    assert loss_at(BEST, 2.5) == pytest.approx(3.5)
    assert loss_at(BEST, 0.0) == 4.0 and loss_at(BEST, 10.0) == pytest.approx(2.0)
    assert loss_at(BEST, 10.5) is None and loss_at((), 1.0) is None


def test_mean_curve_and_noise_of_repeated_runs():
    a = tuple((t, v + 0.01) for t, v in BEST)
    b = tuple((t, v - 0.01) for t, v in BEST)
    assert mean_curve([a, b])[3][1] == pytest.approx(BEST[3][1])
    # two runs 0.02 apart at every time: sd sqrt(2 * 0.01^2 / 1) = 0.01414
    assert curve_noise([[a, b]]) == pytest.approx(0.02 / math.sqrt(2))
    assert curve_noise([[a]]) is None   # one run of a commit: no noise yet


def test_thin_keeps_the_last_point():
    pts = [(float(i), 1.0) for i in range(500)]
    out = thin(pts, 50)
    assert len(out) == 50 and out[-1] == (499.0, 1.0) and out[0] == (0.0, 1.0)


def ref(sigma: float | None = 0.01) -> PruneRef:
    return PruneRef(BEST, sigma, 10.0)


def test_the_band_is_z_sigmas_and_never_below_a_share_of_the_loss():
    assert ref(0.01).band(3.0, z=3) == pytest.approx(0.03)
    assert ref(0.0).band(3.0, z=3) == pytest.approx(MIN_BAND * 3.0)
    assert ref(None).band(3.0) == pytest.approx(MIN_BAND * 3.0)


def test_a_run_behind_all_the_way_is_pruned_after_the_warm_up_share_on_confirmed_lines():
    watch = Watch(ref(), share=0.5, z=3, project=True)
    stopped = [t for t, v in BEST if watch.see(t, v + 0.5)]
    assert len(stopped) == 1 and stopped[0] == 5.0 + CONFIRM_LINES - 1   # 5 s is the warm-up share
    assert watch.verdict is not None and watch.verdict.gap == pytest.approx(0.5)


def test_a_run_within_the_band_or_closing_its_gap_is_not_pruned():
    inside = Watch(ref(), share=0.5, z=3)
    assert not any(inside.see(t, v + 0.02) for t, v in BEST)
    # behind by 0.6 at half the budget, the gap falling 0.15 a second: ahead at the end
    closing = Watch(ref(), share=0.5, z=3, project=True)
    assert not any(closing.see(t, v + max(-0.1, 0.6 - 0.15 * max(0.0, t - 4))) for t, v in BEST)
    # the same without the projection is pruned
    plain = Watch(ref(), share=0.5, z=3, project=False)
    assert any(plain.see(t, v + max(-0.1, 0.6 - 0.15 * max(0.0, t - 4))) for t, v in BEST)


def test_a_spike_on_one_line_is_not_enough():
    watch = Watch(ref(), share=0.5, z=3, project=False)
    assert not any(watch.see(t, v + (0.5 if t == 7 else 0.0)) for t, v in BEST)


def test_partial_gap_and_the_switch_off_as_scouting_has_it():
    assert partial_gap(tuple((t, v + 0.1) for t, v in BEST), ref(), 0.5) == pytest.approx(0.1)
    agreeing = [(0.01 * k, 0.001 * k) for k in range(MIN_PAIRS + 2)]
    assert rule_off(agreeing) is None
    reversed_ = [(0.01 * k, -0.001 * k) for k in range(MIN_PAIRS + 2)]
    off = rule_off(reversed_)
    assert off is not None and off.pairs == MIN_PAIRS and off.rho is not None and off.rho < 0


def record(trial: int, commit: str, parent: str | None, metric: float, offset: float, kind: str = "candidate",
           status: str = "discard") -> LedgerRecord:
    curve = [[t, v + offset] for t, v in BEST]
    return LedgerRecord(trial=trial, kind=kind, started_at=0.0, ended_at=1.0, proposer="queue", parent=parent,
                        commit=commit, description=f"idea {trial}", status=status, metric=metric,
                        extra={"curve": curve, "budget_s": 10.0})


def test_a_night_whose_early_loss_ranks_against_the_end_turns_the_rule_off():
    base = record(0, "b" * 40, None, 2.0, 0.0, kind="baseline", status="keep")
    # each trial is further behind at the warm-up share, yet ends further ahead
    trials = [record(k, f"{k:040d}", base.commit, 2.0 - 0.01 * k, 0.001 * k) for k in range(1, MIN_PAIRS + 2)]
    records = [base, *trials]
    found = pairs(records, 10.0)
    assert len(found) == MIN_PAIRS + 1 and found[0] == (pytest.approx(0.001), pytest.approx(-0.01))
    summary = pruning(records, 10.0)
    assert summary is not None and summary.off is not None and summary.off.pairs == MIN_PAIRS
    assert "rule turned off" in summary.line()
    agreeing = [base, *[record(k, f"{k:040d}", base.commit, 2.0 + 0.01 * k, 0.001 * k) for k in range(1, 12)]]
    assert pruning(agreeing, 10.0).off is None   # type: ignore[union-attr]


def test_a_pruned_record_counts_the_training_it_did_not_spend():
    pruned = record(1, "c" * 40, "b" * 40, 0.0, 0.5, status="pruned").model_copy(
        update={"metric": None, "extra": {"prune": {"at_s": 6.0, "budget_s": 10.0}, "curve": [[6.0, 3.0]]}})
    summary = pruning([pruned], 10.0)
    assert summary is not None and summary.pruned == 1 and summary.saved_seconds == pytest.approx(4.0)
    assert saved_seconds(pruned) == pytest.approx(4.0)


def test_a_run_behind_in_time_but_not_at_the_same_step_is_not_pruned():
    # the best took 10 steps a second; this run the same losses per step at 5 a second (a slower
    # machine): behind at every elapsed time, not at any step
    steps = tuple((10.0 * t, v) for t, v in BEST)
    best = PruneRef(BEST, 0.01, 10.0, steps)
    slow = [(t, loss_at(steps, 5.0 * t), 5.0 * t) for t, _ in BEST]
    watch = Watch(best, share=0.3, z=1)
    assert not any(watch.see(t, v, s) for t, v, s in slow)
    assert "fewer steps, not worse ones" in judge_point(6.0, slow[6][1], best, 0.3, 1, slow[6][2]).reason
    # worse at the same step too: stopped
    worse = Watch(best, share=0.3, z=1)
    assert any(worse.see(t, v + 0.5, s) for t, v, s in slow)


def test_with_the_machines_speed_known_a_slower_machine_is_spared_and_slower_steps_are_not():
    # the best took 10 steps a second at speed 2.0 (two CPUs free)
    steps = tuple((10.0 * t, v) for t, v in BEST)
    best = PruneRef(BEST, 0.01, 10.0, steps, speed=2.0)
    slow = [(t, loss_at(steps, 5.0 * t), 5.0 * t) for t, _ in BEST]   # half the steps, the same loss per step
    # the machine at half its speed (a neighbour took a CPU): spared, read at the best's 0.50 pace
    assert not any(Watch(best, share=0.3, z=1).see(t, v, s, speed=1.0) for t, v, s in slow)
    assert "0.50 of the best's pace" in judge_point(6.0, slow[6][1], best, 0.3, 1, slow[6][2], speed=1.0).reason
    # the machine as fast as the best's: the change makes steps slower, which the budget counts
    watch = Watch(best, share=0.3, z=1)
    assert any(watch.see(t, v, s, speed=2.0) for t, v, s in slow)
    assert watch.verdict is not None and "pace" not in watch.verdict.reason and watch.verdict.gap > 0.3
    # a faster machine now is not held against the run (the pace is capped at 1)
    assert best.pace(4.0) == 1.0 and best.pace(None) is None and PruneRef(BEST, 0.01, 10.0).pace(2.0) is None
    # without a speed the step check decides as before: slower steps spared
    assert not any(Watch(best, share=0.3, z=1).see(t, v, s) for t, v, s in slow)
