"""Keep or discard: constructed inputs, both directions, ties and the min_delta edge."""

from __future__ import annotations

import math

import pytest

from autoloop.decide import Decision, decide, improvement, required_improvement


def test_improvement_is_positive_when_better_in_either_direction():
    assert improvement(1.0, 1.5, "min") == pytest.approx(0.5)
    assert improvement(2.0, 1.5, "min") == pytest.approx(-0.5)
    assert improvement(0.9, 0.8, "max") == pytest.approx(0.1)
    assert improvement(0.7, 0.8, "max") == pytest.approx(-0.1)
    with pytest.raises(ValueError):
        improvement(1.0, 1.0, "lower")


def test_first_result_is_the_baseline():
    assert decide(1.5, None, "min") == Decision("keep", "baseline", None)
    assert decide(0.1, None, "max", min_delta=5.0).status == "keep"


def test_min_direction():
    d = decide(1.2, 1.234, "min")
    assert d.status == "keep" and d.delta == pytest.approx(0.034)
    assert d.reason == "improved by 0.0340 (1.2000 vs best 1.2340)"
    d = decide(1.2372, 1.234, "min")
    assert d.status == "discard" and d.delta == pytest.approx(-0.0032)
    assert d.reason == "no improvement (+0.0032 vs best 1.2340)"


def test_max_direction():
    d = decide(0.91, 0.90, "max")
    assert d.status == "keep" and d.delta == pytest.approx(0.01)
    d = decide(0.89, 0.90, "max")
    assert d.status == "discard" and d.delta == pytest.approx(-0.01)
    assert d.reason == "no improvement (-0.0100 vs best 0.9000)"


@pytest.mark.parametrize("direction", ["min", "max"])
def test_a_tie_is_discarded(direction):
    d = decide(1.234, 1.234, direction)
    assert d.status == "discard" and d.delta == 0
    assert d.reason == "no improvement (+0.0000 vs best 1.2340)"


def test_min_delta_edge():
    # Exactly representable numbers so the edge is the edge: improvement 0.25 vs min_delta 0.25.
    assert decide(1.0, 1.25, "min", min_delta=0.25).status == "discard"
    assert decide(0.9375, 1.25, "min", min_delta=0.25).status == "keep"
    assert decide(1.5, 1.25, "max", min_delta=0.25).status == "discard"
    assert decide(1.5625, 1.25, "max", min_delta=0.25).status == "keep"
    d = decide(1.2337, 1.234, "min", min_delta=0.001)
    assert d.status == "discard" and d.delta == pytest.approx(0.0003)
    assert d.reason == "improvement 3.00e-04 <= min_delta 0.0010"


def test_noise_threshold_slot_is_off_by_default():
    assert required_improvement(0.001) == (0.001, "min_delta 0.0010")
    assert required_improvement(0.001, noise=0.002, z=0.0)[0] == 0.001
    threshold, label = required_improvement(0.001, noise=0.002, z=2.0)
    assert threshold == pytest.approx(0.004) and label == "2 x noise 0.0020"
    d = decide(1.23, 1.233, "min", min_delta=0.001, noise=0.002, z=2.0)
    assert d.status == "discard" and "2 x noise" in d.reason
    assert decide(1.22, 1.233, "min", min_delta=0.001, noise=0.002, z=2.0).status == "keep"


def test_non_finite_inputs():
    assert decide(math.nan, 1.0, "min").status == "discard"
    assert decide(math.inf, 1.0, "max").status == "discard"
    assert decide(1.0, math.nan, "min").status == "keep"      # a NaN best must not block forever
    assert decide(1.0, math.inf, "min").status == "keep"


def test_bad_arguments():
    with pytest.raises(ValueError):
        decide(1.0, 1.0, "down")
    with pytest.raises(ValueError):
        decide(1.0, 1.0, "min", min_delta=-0.1)


def test_reasons_are_one_line():
    for d in (decide(1.0, None, "min"), decide(1.0, 2.0, "min"), decide(2.0, 1.0, "min"),
              decide(1.9999, 2.0, "min", 0.01)):
        assert "\n" not in d.reason and d.reason
