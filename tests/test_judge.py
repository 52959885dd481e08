"""Keep or discard: constructed inputs, both directions, ties and the min_delta edge."""

from __future__ import annotations

import math

import pytest

from autoloop.core.judge import MetricVerdict, improvement, judge_metric, required_improvement


def test_improvement_is_positive_when_better_in_either_direction():
    assert improvement(1.0, 1.5, "min") == pytest.approx(0.5)
    assert improvement(2.0, 1.5, "min") == pytest.approx(-0.5)
    assert improvement(0.9, 0.8, "max") == pytest.approx(0.1)
    assert improvement(0.7, 0.8, "max") == pytest.approx(-0.1)
    with pytest.raises(ValueError):
        improvement(1.0, 1.0, "lower")


def test_first_result_is_the_baseline():
    assert judge_metric(1.5, None, "min") == MetricVerdict("keep", "baseline", None)
    assert judge_metric(0.1, None, "max", min_delta=5.0).status == "keep"


def test_min_direction():
    d = judge_metric(1.2, 1.234, "min")
    assert d.status == "keep" and d.delta == pytest.approx(0.034)
    assert d.reason == "improved by 0.0340 (1.2000 vs best 1.2340)"
    d = judge_metric(1.2372, 1.234, "min")
    assert d.status == "discard" and d.delta == pytest.approx(-0.0032)
    assert d.reason == "no improvement (+0.0032 vs best 1.2340)"


def test_max_direction():
    d = judge_metric(0.91, 0.90, "max")
    assert d.status == "keep" and d.delta == pytest.approx(0.01)
    d = judge_metric(0.89, 0.90, "max")
    assert d.status == "discard" and d.delta == pytest.approx(-0.01)
    assert d.reason == "no improvement (-0.0100 vs best 0.9000)"


@pytest.mark.parametrize("direction", ["min", "max"])
def test_a_tie_is_discarded(direction):
    d = judge_metric(1.234, 1.234, direction)
    assert d.status == "discard" and d.delta == 0
    assert d.reason == "no improvement (+0.0000 vs best 1.2340)"


def test_min_delta_edge():
    # Exactly representable numbers so the edge is the edge: improvement 0.25 vs min_delta 0.25.
    assert judge_metric(1.0, 1.25, "min", min_delta=0.25).status == "discard"
    assert judge_metric(0.9375, 1.25, "min", min_delta=0.25).status == "keep"
    assert judge_metric(1.5, 1.25, "max", min_delta=0.25).status == "discard"
    assert judge_metric(1.5625, 1.25, "max", min_delta=0.25).status == "keep"
    d = judge_metric(1.2337, 1.234, "min", min_delta=0.001)
    assert d.status == "discard" and d.delta == pytest.approx(0.0003)
    assert d.reason == "improvement 3.00e-04 <= min_delta 0.0010"


def test_noise_threshold_slot_is_off_by_default():
    assert required_improvement(0.001) == (0.001, "min_delta 0.0010")
    assert required_improvement(0.001, noise=0.002, z=0.0)[0] == 0.001
    threshold, label = required_improvement(0.001, noise=0.002, z=2.0)
    assert threshold == pytest.approx(0.004) and label == "2 x noise 0.0020"
    d = judge_metric(1.23, 1.233, "min", min_delta=0.001, noise=0.002, z=2.0)
    assert d.status == "discard" and "2 x noise" in d.reason
    assert judge_metric(1.22, 1.233, "min", min_delta=0.001, noise=0.002, z=2.0).status == "keep"


def test_non_finite_inputs():
    assert judge_metric(math.nan, 1.0, "min").status == "discard"
    assert judge_metric(math.inf, 1.0, "max").status == "discard"
    assert judge_metric(1.0, math.nan, "min").status == "keep"      # a NaN best must not block forever
    assert judge_metric(1.0, math.inf, "min").status == "keep"


def test_bad_arguments():
    with pytest.raises(ValueError):
        judge_metric(1.0, 1.0, "down")
    with pytest.raises(ValueError):
        judge_metric(1.0, 1.0, "min", min_delta=-0.1)


def test_reasons_are_one_line():
    for d in (judge_metric(1.0, None, "min"), judge_metric(1.0, 2.0, "min"), judge_metric(2.0, 1.0, "min"),
              judge_metric(1.9999, 2.0, "min", 0.01)):
        assert "\n" not in d.reason and d.reason


# ---------------------------------------------------------------------------------------------
# Noise: estimate, confidence, the strict and noise keep rules, confirmation re-runs

from autoloop.core.judge import confidence, effective_rule, judge_runs, noise_estimate  # noqa: E402


def test_noise_estimate_is_the_sample_stdev():
    sigma, method = noise_estimate([1.0, 1.2, 1.1])
    assert method == "stdev" and sigma == pytest.approx(0.1)
    assert noise_estimate([1.0]) == (None, "stdev")
    assert noise_estimate([1.0, float("nan")])[0] is None
    assert noise_estimate([2.0, 2.0])[0] == 0.0


def test_confidence_in_sigma_signed():
    assert confidence(0.03, 0.01) == pytest.approx(3.0)
    assert confidence(-0.02, 0.01) == pytest.approx(-2.0)
    assert confidence(0.03, None) is None
    assert confidence(0.03, 0.0) is None
    assert confidence(None, 0.01) is None


def test_auto_rule_is_noise_once_an_estimate_exists():
    assert effective_rule("auto", None) == "strict"
    assert effective_rule("auto", 0.0) == "strict"
    assert effective_rule("auto", 0.01) == "noise"
    assert effective_rule("strict", 0.01) == "strict"
    assert effective_rule("noise", None) == "noise"
    with pytest.raises(ValueError):
        effective_rule("lenient", 0.01)


def test_strict_keeps_any_gain_the_noise_rule_confirms_it():
    # best 1.00, noise 0.01, z 2 -> threshold 0.02; the candidate gains 0.01 (1 sigma).
    strict = judge_runs([0.99], 1.00, "min", noise=0.01, z=2.0, rule="strict")
    assert strict.status == "keep" and strict.rule == "strict"
    assert strict.confidence == pytest.approx(1.0)
    noisy = judge_runs([0.99], 1.00, "min", noise=0.01, z=2.0, rule="noise")
    assert noisy.status == "confirm" and "within noise" in noisy.reason
    assert noisy.confidence == pytest.approx(1.0)
    auto = judge_runs([0.99], 1.00, "min", noise=0.01, z=2.0)
    assert auto.status == "confirm" and auto.rule == "noise"


def test_clear_gain_is_kept_at_once_and_losses_are_never_confirmed():
    d = judge_runs([0.97], 1.00, "min", noise=0.01, z=2.0, rule="noise")
    assert d.status == "keep" and d.confidence == pytest.approx(3.0) and d.mean == pytest.approx(0.97)
    d = judge_runs([1.005], 1.00, "min", noise=0.01, z=2.0, rule="noise")
    assert d.status == "discard" and d.reason.startswith("no improvement") and d.confidence == pytest.approx(-0.5)
    d = judge_runs([1.00], 1.00, "min", noise=0.01, z=2.0, rule="noise")
    assert d.status == "discard"    # a tie is never confirmed


def test_confirmation_judges_the_mean_of_the_runs():
    # The re-run holds the gain: mean 0.975 -> improvement 0.025 > 0.02: keep, value = mean.
    d = judge_runs([0.99, 0.96], 1.00, "min", noise=0.01, z=2.0, rule="noise", can_confirm=False)
    assert d.status == "keep" and d.mean == pytest.approx(0.975) and d.delta == pytest.approx(0.025)
    assert d.reason.startswith("mean of 2 runs")
    # The re-run regresses: mean 0.995 -> 0.005 <= 0.02: within noise, discarded.
    d = judge_runs([0.99, 1.00], 1.00, "min", noise=0.01, z=2.0, rule="noise", can_confirm=False)
    assert d.status == "discard" and d.reason.startswith("within noise")
    # A within-noise gain on a single run with no confirmation allowed: discarded.
    d = judge_runs([0.99], 1.00, "min", noise=0.01, z=2.0, rule="noise", can_confirm=False)
    assert d.status == "discard" and "within noise" in d.reason
    # Two runs already: no further confirmation even if allowed.
    d = judge_runs([0.99, 0.99], 1.00, "min", noise=0.01, z=2.0, rule="noise")
    assert d.status == "discard"


def test_threshold_edges():
    # Exactly z x noise is not enough (strictly more is required); just above is.
    # (binary-exact numbers: 1.0 - 0.5 == 2 x 0.25 with no rounding)
    assert judge_runs([0.5], 1.0, "min", noise=0.25, z=2.0, rule="noise").status == "confirm"
    assert judge_runs([0.4999], 1.0, "min", noise=0.25, z=2.0, rule="noise").status == "keep"
    # min_delta larger than z x noise is the threshold.
    assert judge_runs([0.96], 1.00, "min", 0.05, noise=0.01, z=2.0, rule="noise").status == "confirm"
    assert judge_runs([0.94], 1.00, "min", 0.05, noise=0.01, z=2.0, rule="noise").status == "keep"
    # strict: exactly min_delta is a discard, not a confirmation.
    assert judge_runs([0.75], 1.0, "min", 0.25, rule="strict").status == "discard"
    # noise rule without an estimate falls back to min_delta: no confirmation possible.
    assert judge_runs([0.999], 1.00, "min", noise=None, rule="noise").status == "keep"


def test_noise_rule_in_the_max_direction():
    assert judge_runs([0.81], 0.80, "max", noise=0.01, z=2.0).status == "confirm"
    assert judge_runs([0.83], 0.80, "max", noise=0.01, z=2.0).status == "keep"
    assert judge_runs([0.79], 0.80, "max", noise=0.01, z=2.0).status == "discard"
    d = judge_runs([0.81, 0.84], 0.80, "max", noise=0.01, z=2.0, can_confirm=False)
    assert d.status == "keep" and d.mean == pytest.approx(0.825) and d.confidence == pytest.approx(2.5)


def test_baseline_and_non_finite_runs():
    assert judge_runs([1.5], None, "min", noise=0.01).status == "keep"
    assert judge_runs([float("nan")], 1.0, "min", noise=0.01).status == "discard"
