"""How many repeats a claimed effect needs, from the measured noise: pure statistics.

Two uses: how many seeds `autoloop verify` runs of each variant (:func:`chosen_repeats`), and
how many runs the keep rule's confirmation of a within-noise gain asks for
(:func:`confirm_runs`, below).

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
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

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


# ---------------------------------------------------------------------------------------------
# The keep rule's confirmation: how many runs a within-noise gain is judged on.
#
# A candidate whose first run improves on the best, but by no more than the keep rule's bar
# (core/judge.py: max(min_delta, z·σ/√n) for the mean of n runs), is run again with new seeds
# and judged once, on the mean of all its runs. How many runs: the fewest n at which the keep
# rule would keep a gain of the size the first run showed with the power asked (--power).
#
# The variance assumed. What is compared is the candidate's mean of n runs, X̄ₙ, against the
# best's value, which is itself the mean B̄ₘ of the best's m runs (its keep and confirmations,
# or the baseline and its noise samples). Both are means of runs with the night's run-to-run
# spread σ (measured on the best; one run of the candidate cannot measure its own), with
# independent seeds, so
#
#     Var(X̄ₙ − B̄ₘ) = σ²·(1/n + 1/m).
#
# The best's value is not a known constant: its own error stays in every comparison with it,
# and no number of runs of the candidate removes it. The keep rule's bar holds only the
# candidate's part (z·σ/√n); the power is the chance that the difference, with the variance
# above, clears that bar:
#
#     P(n) = 1 − Φ((bar(n) − δ) / (σ·√(1/n + 1/m))),   bar(n) = max(min_delta, z·σ/√n).
#
# As n grows, P(n) tends to Φ((δ − min_delta)·√m/σ): a gain smaller than about z_P·σ/√m can
# not be shown with power P however often the candidate runs (the best's m runs limit it).
# δ is the gain the first run showed. That is an estimate biased upwards (a first run that
# looks better than it is is the one that lands in the band more often), so the count errs
# towards too few runs, never too many: the report names the keeps that got fewer than asked.

MAX_CONFIRMATIONS = 3    # extra runs of one candidate at most: each costs a full --budget of device time,
                         # and the trials' own ideas are what a night is for; 4 runs in all show a gain of
                         # about 1.5 σ against a best of 3 runs with 80 % power (benchmarks/confirm_power.py)
SEARCH_LIMIT = 1000      # the count searched up to; beyond it "no count reaches it"


@dataclass(frozen=True)
class ConfirmCount:
    """A confirmation's count and why: the record's ``extra.confirmation``."""

    runs: int                 # the runs the candidate is judged on, its first included
    needs: int | None         # the runs the power asked for needs, uncapped; None: no count reaches it
    power: float              # the power ``runs`` give the gain
    asked: float              # the power asked for (--power)
    gain: float               # the first run's gain over the best
    sigma: float              # the night's noise
    best_runs: int            # the runs the best's value is the mean of

    @property
    def under_powered(self) -> bool:
        return self.needs is None or self.needs > self.runs

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: object) -> ConfirmCount | None:
        """From a record's ``extra.confirmation``; None where it is missing or not one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            return None

    def text(self) -> str:
        """'confirming with 3 more runs (4 runs for 80% power ...)', for the reason."""
        more = self.runs - 1
        what = "a re-run" if more == 1 else f"{more} more runs"
        at = (f"to keep a gain of {self.gain:.4g} at σ {self.sigma:.4g} against a best of {self.best_runs} "
              f"run{'' if self.best_runs == 1 else 's'}")
        if not self.under_powered:
            return f"confirming with {what} ({self.runs} runs for {self.asked:.0%} power {at})"
        need = (f"{self.asked:.0%} needs {self.needs}" if self.needs is not None
                else f"no count reaches {self.asked:.0%}")
        return (f"confirming with {what} ({self.runs} runs give {self.power:.0%} power {at}; {need}, "
                f"capped at {MAX_CONFIRMATIONS} more)")


def keep_power(gain: float, sigma: float, runs: int, best_runs: int, z: float, min_delta: float = 0.0) -> float:
    """The chance that the keep rule keeps a true ``gain`` judged on the mean of ``runs`` runs
    against a best that is the mean of ``best_runs`` (see the comment above)."""
    bar = max(min_delta, z * sigma / math.sqrt(runs))
    sd = sigma * math.sqrt(1 / runs + 1 / max(1, best_runs))
    return 1 - _Z.cdf((bar - gain) / sd)


def confirm_runs(gain: float, sigma: float, best_runs: int, power: float, z: float,
                 min_delta: float = 0.0) -> ConfirmCount:
    """The runs a within-noise first run's ``gain`` is judged on: the fewest (at least 2) whose
    :func:`keep_power` reaches ``power``, capped at 1 + MAX_CONFIRMATIONS."""
    needs = next((n for n in range(2, SEARCH_LIMIT + 1)
                  if keep_power(gain, sigma, n, best_runs, z, min_delta) >= power), None)
    runs = min(needs, 1 + MAX_CONFIRMATIONS) if needs is not None else 1 + MAX_CONFIRMATIONS
    return ConfirmCount(runs=runs, needs=needs, power=keep_power(gain, sigma, runs, best_runs, z, min_delta),
                        asked=power, gain=gain, sigma=sigma, best_runs=best_runs)
