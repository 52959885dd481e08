"""The metric's dependence on the machine's speed, fitted from the night's own repeats.

Repeats of one commit (the baseline's noise samples, confirmation re-runs, verification
runs) differ only by their seed and by the machine they happened to get. Each run's
``machine_speed`` comes from a reference probe beside it (execution/machine_speed.py), so
over the repeats the metric is fitted as ``metric ~ a_commit + b * ln(speed)``: one
intercept per commit, one pooled slope. The fit is *used* only where it shrinks the residual
spread of the repeats (counted with the slope's lost degree of freedom) to at most
:data:`SHRINK` of the raw, its slope stands :data:`MIN_T` standard errors from zero, and the
speeds varied at all; otherwise decisions stay on the raw metric and :attr:`SpeedFit.note` says why
(on a dedicated GPU the probe finds little, and nothing is adjusted).

An adjusted value is the metric the run would have reached at the night's median speed:
``metric - b * (ln(speed) - ln(median))``. A change that makes training itself faster is not
touched by this: its own runs see the same machine speeds, only its steps go up.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MIN_RESIDUAL_DOF = 2          # repeats minus commits minus the slope: below this, no fit
STEADY_SPREAD = 0.02          # speeds within +-2 % (stdev of ln speed): the machine held steady
SHRINK = 0.8                  # adjust only when the residual spread is at most this share of the raw
MIN_T = 3.0                   # ... and the slope is this many standard errors from 0: with 5 repeats a
                              # chance correlation of the seeds' noise with the speeds shrinks it too


@dataclass(frozen=True)
class Run:
    """One measured run: its commit, metric and machine speed (None: not measured)."""

    commit: str
    metric: float
    speed: float | None


@dataclass(frozen=True)
class SpeedFit:
    use: bool                     # decide on adjusted values
    note: str                     # one line: what was found, and whether decisions use it
    slope: float | None = None    # d metric / d ln(speed)
    reference: float | None = None   # the night's median speed: adjusted values are at it
    raw_spread: float | None = None  # pooled within-commit stdev of the repeats, raw
    adjusted_spread: float | None = None   # the same after the fit
    repeats: int = 0              # runs in commits with two or more measured runs
    commits: int = 0

    def adjust(self, metric: float, speed: float | None) -> float:
        """The metric at the reference speed (the metric itself when the fit is not used)."""
        if not self.use or speed is None or not _ok(speed) or self.slope is None or self.reference is None:
            return metric
        return metric - self.slope * (math.log(speed) - math.log(self.reference))


def fit(runs: list[Run]) -> SpeedFit:
    """The pooled fit over the repeats in ``runs`` (see the module docstring)."""
    speeds = [r.speed for r in runs if r.speed is not None and _ok(r.speed) and math.isfinite(r.metric)]
    if not speeds:
        return SpeedFit(False, "no machine speed measured: decisions on the raw metric")
    reference = statistics.median(speeds)
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if r.speed is not None and _ok(r.speed) and math.isfinite(r.metric):
            groups.setdefault(r.commit, []).append((math.log(r.speed), r.metric))
    groups = {c: g for c, g in groups.items() if len(g) >= 2}
    n, k = sum(len(g) for g in groups.values()), len(groups)
    if n - k - 1 < MIN_RESIDUAL_DOF:
        return SpeedFit(False, f"{n} repeats of {k} commit{'s' if k != 1 else ''}: too few to fit the machine's "
                        "speed; raw metric",
                        reference=reference, repeats=n, commits=k)
    sxx = sxy = syy = 0.0
    for g in groups.values():
        mx, my = sum(x for x, _ in g) / len(g), sum(y for _, y in g) / len(g)
        sxx += sum((x - mx) ** 2 for x, _ in g)
        sxy += sum((x - mx) * (y - my) for x, y in g)
        syy += sum((y - my) ** 2 for _, y in g)
    raw = math.sqrt(syy / (n - k))
    steady = math.sqrt(sxx / (n - k))
    if steady < STEADY_SPREAD or sxx <= 0:
        return SpeedFit(False, f"the machine's speed held steady (+-{steady:.1%} over {n} repeats): not adjusted",
                        reference=reference, raw_spread=raw, repeats=n, commits=k)
    slope = sxy / sxx
    adjusted = math.sqrt(max(0.0, syy - slope * sxy) / (n - k - 1))
    t = abs(slope) / (adjusted / math.sqrt(sxx)) if adjusted > 0 else math.inf
    use = adjusted <= SHRINK * raw and t >= MIN_T
    commits = f"{k} commit{'s' if k != 1 else ''}"
    said = (f"metric {slope:+.4f} per ln(speed) over {n} repeats of {commits}; "
            f"spread {raw:.4f} raw, {adjusted:.4f} adjusted")
    note = f"{said}: decisions on adjusted values" if use else f"{said}: no gain, decisions on the raw metric"
    return SpeedFit(use, note, slope, reference, raw, adjusted, n, k)


def _ok(speed: float) -> bool:
    return math.isfinite(speed) and speed > 0


@dataclass(frozen=True)
class Adjusted:
    """What the keep decision compares when the night's fit is used: this commit's runs and
    the best's value, both at the reference speed, and the noise after the fit."""

    runs: tuple[float, ...]
    best: float | None
    noise: float | None
    note: str


def adjusted_inputs(f: SpeedFit, runs: list[tuple[float, float | None]], best: list[tuple[float, float | None]],
                    noise: float | None) -> Adjusted | None:
    """The keep decision's inputs at the reference speed, or None when the fit is not used
    or a run's speed is unknown (then every figure stays raw: never half of each)."""
    if not f.use or any(s is None for _, s in (*runs, *best)):
        return None
    best_adj = [f.adjust(m, s) for m, s in best]
    return Adjusted(tuple(f.adjust(m, s) for m, s in runs), sum(best_adj) / len(best_adj) if best_adj else None,
                    f.adjusted_spread if noise is not None else None, f.note)
