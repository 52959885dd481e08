"""How many repeats a claimed effect needs, from the measured noise: pure statistics.

A verification measures a kept change's contribution as the difference of two means over R
seeds (the best and the best without it). With a run-to-run spread σ, that difference has a
standard error of σ·√(2/R) (the seeds are paired, which only helps; the bound is kept), so
seeing an effect δ in a two-sided test at level α with power 1 − β needs

    R ≥ 2·((z_{1−α/2} + z_{1−β})·σ/δ)²

which at α = 5 % and 80 % power is R ≥ 15.7·(σ/δ)²: a gain of one σ needs 16 repeats, of
three σ 2. A fixed count of 3 is enough for gains above about 2.3 σ and too few below.
"""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

ALPHA = 0.05            # two-sided, as the verification's 95 % intervals
MIN_REPEATS = 2         # an interval needs two
MAX_REPEATS = 10        # a verification's runs grow with repeats x variants: past this, say under-powered
FALLBACK_REPEATS = 3    # where no noise was measured: the count verify always used

_Z = NormalDist()


def repeats_for(effect: float, sigma: float, power: float = 0.8, alpha: float = ALPHA) -> int:
    """The repeats a difference of two means needs to show ``effect`` with ``power``."""
    if sigma <= 0:
        return MIN_REPEATS
    if effect == 0:
        return sys.maxsize   # no count shows nothing: the caller caps it and says so
    z = _Z.inv_cdf(1 - alpha / 2) + _Z.inv_cdf(power)
    return max(MIN_REPEATS, math.ceil(2 * (z * sigma / abs(effect)) ** 2))


def power_of(effect: float, sigma: float, repeats: int, alpha: float = ALPHA) -> float:
    """The power R repeats give to see ``effect`` (the two-sided test's larger tail)."""
    if sigma <= 0:
        return 1.0
    se = sigma * math.sqrt(2 / repeats)
    return 1 - _Z.cdf(_Z.inv_cdf(1 - alpha / 2) - abs(effect) / se)


def chosen_repeats(effects: list[float], sigma: float | None, power: float) -> tuple[int, str]:
    """The repeats for the smallest claimed effect, capped, and one line saying why."""
    if sigma is None or not effects:
        return FALLBACK_REPEATS, (f"{FALLBACK_REPEATS} repeats: no noise measured this night (--noise-runs measures "
                                  "it; --repeats R chooses)")
    smallest = min(abs(e) for e in effects)
    need = repeats_for(smallest, sigma, power)
    n = min(need, MAX_REPEATS)
    capped = f", capped at {MAX_REPEATS} (it needs {need})" if need > MAX_REPEATS else ""
    return n, (f"{n} repeats from power: the smallest kept gain {smallest:.4g} at the night's σ {sigma:.4g} "
               f"needs {min(need, 999)} for {power:.0%} power at a two-sided {ALPHA:.0%}{capped}")
