"""The scout rung (--scout): pure rules of a multi-fidelity night (docs/fidelity.md).

Each proposal first trains for the short scout budget. Only a candidate whose scout result
is within a margin of the best's scout result goes on to the full budget, where the keep
is decided as always. Three rules, all pure:

* the margin: ``z`` times the scout rung's own noise (the spread of repeated scout runs
  of one commit, pooled over the commits that have them), widened for a reference that is
  itself the mean of few runs: ``z * sigma * sqrt(1 + 1/n)``. Never a constant: a rung
  twice as noisy lets twice as much through;
* the promotion: better than the best's scout mean, or worse by no more than the margin;
* the switch-off: the rank agreement of the two rungs (Spearman over the promoted
  candidates' scout and full results) measured as the night goes; once ``MIN_PAIRS``
  pairs exist and it is below ``RHO_FLOOR``, the scout rung stops predicting and
  scouting turns itself off for the rest of the night.

The engine (engine/scout.py, core/keep.py) and benchmarks/scout.py call these same
functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoloop.core.judge import Direction, improvement

# Promoted candidates with both rungs measured before the agreement may switch scouting
# off: fewer pairs give a Spearman too noisy to act on (benchmarks/scout.py, 40 nights:
# with 8, a landscape whose rungs agree at 0.9 is switched off on about one night in four,
# one at 0.3 on nine in ten).
MIN_PAIRS = 8
# The margin's z: a candidate whose scout result is worse than the best's by more than
# MARGIN_Z scout sigmas (the reference's own noise allowed for) is scouted out. One-sided
# and small: a change the full rung would keep must beat the best there by the noise rule's
# z, so at the scout rung it rarely trails the best at all; a larger z lets through the
# many changes that are a little worse (benchmarks/scout.py: 1.0 gave 1.52x the gain per
# device-hour at rho 0.9 where 0.5 gave 1.65x, 1.5 gave 1.37x).
MARGIN_Z = 0.5
# Below this rank agreement (over the promoted, so range-restricted, candidates: where the
# landscape's rungs agree at 0.9 these agree at about 0.6, at 0.3 about 0.2) the scout
# result no longer tells which full result is better.
RHO_FLOOR = 0.3


@dataclass(frozen=True)
class ScoutRef:
    """What a scout result is judged against: the best's scout runs and the rung's noise."""

    runs: tuple[float, ...] = ()        # the scout results of the best commit
    sigma: float | None = None          # the scout rung's noise (pooled_sigma)

    @property
    def mean(self) -> float | None:
        return sum(self.runs) / len(self.runs) if self.runs else None


@dataclass(frozen=True)
class ScoutVerdict:
    promote: bool
    reason: str
    reference: float | None             # the best's scout mean
    margin: float | None


def pooled_sigma(groups: Sequence[Sequence[float]]) -> float | None:
    """The rung's noise: the pooled standard deviation of repeated runs of the same commit
    (each group one commit's runs, different seeds); None until some commit has two."""
    ss, dof = 0.0, 0
    for group in groups:
        xs = [x for x in group if math.isfinite(x)]
        if len(xs) < 2:
            continue
        mean = sum(xs) / len(xs)
        ss += sum((x - mean) ** 2 for x in xs)
        dof += len(xs) - 1
    return math.sqrt(ss / dof) if dof else None


def margin(sigma: float | None, z: float, n_ref: int) -> float | None:
    """How much worse than the best's scout mean a candidate may be and still be promoted."""
    if sigma is None or n_ref < 1 or not math.isfinite(sigma):
        return None
    return z * sigma * math.sqrt(1 + 1 / n_ref)


def judge_scout(value: float, ref: ScoutRef, direction: Direction, z: float | None = None) -> ScoutVerdict:
    """Promote to the full budget, or scout out. Without a reference or a noise estimate
    there is nothing to judge by: promoted. ``z``: MARGIN_Z unless given."""
    z = MARGIN_Z if z is None else z
    best, m = ref.mean, margin(ref.sigma, z, len(ref.runs))
    if best is None or m is None:
        return ScoutVerdict(True, "scout: no scout reference yet; promoted to the full budget", best, m)
    gain = improvement(value, best, direction)
    shown = f"{value:.6f} vs the best's scout {best:.6f}, margin {m:.6f} ({z:g} x scout noise {ref.sigma:.6f})"
    if gain >= -m:
        return ScoutVerdict(True, f"scout: {shown}; promoted to the full budget", best, m)
    return ScoutVerdict(False, f"scouted out: {shown}", best, m)


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation of (scout, full) pairs; None below 3 pairs or when a
    rung's results are all equal."""
    if len(pairs) < 3:
        return None
    rx, ry = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


@dataclass(frozen=True)
class Agreement:
    pairs: int
    rho: float | None

    @property
    def predicting(self) -> bool:
        """False once enough pairs say the scout rung does not rank as the full one does."""
        return self.pairs < MIN_PAIRS or self.rho is None or self.rho >= RHO_FLOOR

    def line(self) -> str:
        shown = "-" if self.rho is None else f"{self.rho:.2f}"
        return f"rank agreement (Spearman) {shown} over {self.pairs} promoted"


def agreement(pairs: Sequence[tuple[float, float]]) -> Agreement:
    return Agreement(len(pairs), spearman(pairs))


def switched_off(pairs: Sequence[tuple[float, float]]) -> Agreement | None:
    """The agreement at the first pair after which the scout rung stopped predicting (the
    switch is one-way: later pairs, e.g. of a resumed night, do not turn it back on);
    None while it still predicts."""
    for n in range(MIN_PAIRS, len(pairs) + 1):
        found = agreement(pairs[:n])
        if not found.predicting:
            return found
    return None
