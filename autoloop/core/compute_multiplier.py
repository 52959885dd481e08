"""A ladder's gain in the field's own currency: the effective compute multiplier, pure.

A change's Δ in loss shrinks as the loss nears its floor even when the change is worth the
same at every scale: on a stand-in whose loss is ``1 + 2/D`` and whose change saves a fixed
10 % of the reducible part (``0.2/D``), the rungs D = 2, 4, 8 show Δ +0.1, +0.05, +0.025 and
the held-out D = 16 shows +0.0125; a line in Δ against log-compute predicts −0.0167 there and
calls the ladder not predictive, while the change is a steady 1.11× compute multiplier. So:

* **The parent's curve**: its loss against the axis x = log10(compute) (or parameters) over
  every rung, ``L(x) = E + A·10^(−αx)`` (a power law with an irreducible term E; E, A, α > 0
  found by least squares: a coarse grid of E below the lowest loss, then golden-section, each
  E's A and α by a line through log(L − E)). Where that cannot be fitted (three rungs or fewer
  than that many distinct losses, or a curve that is not falling and convex), the local slope:
  the parent's losses joined by straight lines in x, extended by the end segments, used where
  the parent falls at every step.
* **The multiplier at a rung**: the change's loss L_c = L_parent − Δ; the x* where the
  parent's curve reaches L_c; m = 10^(x* − x), how much more compute (or size) the parent
  needs to do what the change does. Its 80 % interval: the change's loss redrawn from N(L_c,
  SE_Δ² + SE_parent²) against the fitted curve: the paired Δ carries the measurement's noise, and
  the parent's own SE at the rung stands for the curve's uncertainty there (refitting the curve
  per draw costs seconds per ladder; with noiseless pairs and a curve fitted through noisy parent
  means, the Δ alone gave an interval of zero width that a 1 % misfit of the curve failed).
* **The verdict on the multiplier**: the line of log10 m against x over the fit rungs
  (``ladder_fit.fit_line``), backtested on the held-out rung's multiplier; HOLDS when log m
  stays steady (or grows), SHRINKING when its slope's whole interval points back toward ×1 (and
  where it reaches ×1, up to 30× the largest rung run). NOISE and SCALE-BOUND (m crossing 1 is
  Δ crossing 0) stay read on Δ, before any fit. The Δ line's own backtest is shown beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoloop.core.ladder_fit import (
    AXES,
    DRAWS,
    HIGH_Q,
    LOW_Q,
    SIGNIFICANT_SE,
    RungDelta,
    Verdict,
    fit_line,
    predictive,
    sci,
    zero_crossing,
)

MIN_POWER_LAW_RUNGS = 4   # three parameters (E, A, α): with three rungs the curve would pass through every point
GRID = 240                # E's coarse grid, before golden-section refines the best
FLOAT_SLACK = 1e-9        # noiseless rungs: a multiplier predicted exactly must not fail the backtest on rounding


@dataclass(frozen=True)
class ParentCurve:
    """The parent's loss (lower is better) against x: a power law with a floor, or straight
    segments between the rungs (the local slope)."""
    kind: str                                  # "power law" | "local slope"
    floor: float = 0.0                         # E
    scale: float = 0.0                         # A
    exponent: float = 0.0                      # α, per decade of x
    xs: tuple[float, ...] = ()                 # the rungs, for the local slope
    ys: tuple[float, ...] = ()

    def x_at(self, loss: float) -> float | None:
        """Where the parent reaches ``loss``; None beyond its floor (no compute reaches it)."""
        if self.kind == "power law":
            if loss <= self.floor:
                return None
            return -math.log10((loss - self.floor) / self.scale) / self.exponent
        xs, ys = self.xs, self.ys
        i = next((k for k in range(len(xs) - 1) if ys[k + 1] <= loss), len(xs) - 2)
        if loss > ys[0]:
            i = 0
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return xs[i] + (loss - ys[i]) / slope

    def describe(self, symbol: str) -> str:
        if self.kind == "power law":
            return f"the parent's loss {self.floor:.4g} + {self.scale:.3g}·{symbol}^-{self.exponent:.3g}"
        return "the parent's loss by its local slope between the rungs (no power law with a floor fits them)"


def _power_law_at(xs: np.ndarray, ys: np.ndarray, floor: float) -> tuple[float, float, float]:
    """(sse, A, α) of the best L = floor + A·10^(−αx) for this floor (a line in log(L − E))."""
    logs = np.log10(ys - floor)
    slope, intercept = np.polyfit(xs, logs, 1)
    scale, exponent = 10 ** float(intercept), -float(slope)
    sse = float(np.sum((floor + scale * 10 ** (-exponent * xs) - ys) ** 2))
    return sse, scale, exponent


def fit_parent(xs: Sequence[float], losses: Sequence[float]) -> ParentCurve | str:
    """The parent's curve over the rungs, or one line saying why none can be made."""
    x, y = np.asarray(xs, float), np.asarray(losses, float)
    if len(x) < 2 or len(set(np.round(x, 12))) < len(x):
        return "fewer than two rungs at distinct places on the axis"
    order = np.argsort(x)
    x, y = x[order], y[order]
    if not np.all(np.diff(y) < 0):
        return (f"the parent's loss does not fall along the rungs ({', '.join(f'{v:.4g}' for v in y)}): "
                "no compute buys the change's loss")
    local = ParentCurve("local slope", xs=tuple(map(float, x)), ys=tuple(map(float, y)))
    if len(x) < MIN_POWER_LAW_RUNGS:
        return local
    span, low = float(y.max() - y.min()), float(y.min())
    # E = low − span·r, r over six decades: from a floor just under the lowest loss to one far below.
    rs = np.geomspace(1e-4, 1e2, GRID)
    sses = [_power_law_at(x, y, low - span * r)[0] for r in rs]
    k = int(np.argmin(sses))
    a, b = math.log(rs[max(k - 1, 0)]), math.log(rs[min(k + 1, GRID - 1)])
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - golden * (b - a), a + golden * (b - a)
        if _power_law_at(x, y, low - span * math.exp(c))[0] < _power_law_at(x, y, low - span * math.exp(d))[0]:
            b = d
        else:
            a = c
    floor = low - span * math.exp((a + b) / 2)
    sse, scale, exponent = _power_law_at(x, y, floor)
    line_sse = float(np.sum((np.polyval(np.polyfit(x, y, 1), x) - y) ** 2))
    if exponent <= 0 or scale <= 0 or sse > line_sse:
        return local
    return ParentCurve("power law", floor, scale, exponent)


@dataclass(frozen=True)
class RungMultiplier:
    x: float
    log10: float | None                 # log10 of the multiplier (None: beyond the parent's floor, or no Δ)
    se: float | None                    # of log10, from the draws
    interval: tuple[float, float] | None  # 80 %, as multipliers

    @property
    def value(self) -> float | None:
        return None if self.log10 is None else 10 ** self.log10


def rung_multiplier(curve: ParentCurve, x: float, parent_loss: float, delta: RungDelta, parent_se: float = 0.0,
                    seed: int = 0) -> RungMultiplier:
    """The effective multiplier of one rung from its Δ (positive: the change helps) and the
    parent's loss there (its mean, and that mean's SE)."""
    if delta.mean is None:
        return RungMultiplier(x, None, None, None)
    at = curve.x_at(parent_loss - delta.mean)
    if at is None:
        return RungMultiplier(x, None, None, None)
    rng = np.random.default_rng(seed)
    spread = math.hypot(delta.se or 0.0, parent_se)
    draws = [curve.x_at(parent_loss - d) for d in delta.mean + rng.standard_normal(DRAWS) * spread]
    logs = np.array([d - x for d in draws if d is not None])
    if len(logs) < DRAWS // 2:   # half the draws beyond the floor: no interval worth giving
        return RungMultiplier(x, at - x, None, None)
    lo, hi = np.quantile(logs, [LOW_Q, HIGH_Q])
    return RungMultiplier(x, at - x, float(np.std(logs)), (10 ** float(lo), 10 ** float(hi)))


def _m(r: RungMultiplier) -> str:
    if r.value is None:
        return "-"
    return f"×{r.value:.3g}" + (f" (80 % ×{r.interval[0]:.3g}..×{r.interval[1]:.3g})" if r.interval else "")


def multiplier_verdict(fit_rungs: Sequence[RungDelta], held: RungDelta, fit_mults: Sequence[RungMultiplier],
                       held_mult: RungMultiplier, curve: ParentCurve, axis: str = "compute") -> Verdict | str:
    """HOLDS, SHRINKING or not predictive, read on the multiplier; or one line saying why the
    multipliers cannot carry a verdict (the caller then reads Δ as before)."""
    sym, unit = AXES[axis]
    usable = [m for m in fit_mults if m.log10 is not None]
    if len(usable) < 2 or held_mult.log10 is None:
        return "a rung's change reaches below the parent's fitted floor: no multiplier there"
    ses = [m.se if m.se is not None else 0.0 for m in usable]
    fit = fit_line([m.x for m in usable], [m.log10 for m in usable if m.log10 is not None], ses, held_mult.x)
    lo, hi = fit.pred_interval
    numbers: dict[str, float | None] = {
        "multiplier": held_mult.value, "multiplier_low": held_mult.interval[0] if held_mult.interval else None,
        "multiplier_high": held_mult.interval[1] if held_mult.interval else None,
        "predicted_multiplier": 10 ** fit.pred, "predicted_multiplier_low": 10 ** lo,
        "predicted_multiplier_high": 10 ** hi, "multiplier_slope": fit.slope,
        "multiplier_slope_low": fit.slope_interval[0], "multiplier_slope_high": fit.slope_interval[1]}
    if curve.kind == "power law":
        numbers.update({"parent_floor": curve.floor, "parent_exponent": curve.exponent})
    name = f"{unit} multiplier"
    # The Δ line's backtest, in the old currency, shown beside the multiplier's.
    delta_fit = fit_line([r.x for r in fit_rungs if r.mean is not None and r.se is not None],
                         [r.mean for r in fit_rungs if r.mean is not None and r.se is not None],
                         [r.se for r in fit_rungs if r.mean is not None and r.se is not None], held.x)
    in_delta = (f"in Δ: held-out {held.mean:+.4g}, a line in Δ predicted {delta_fit.pred:+.4g} "
                f"({'inside' if predictive(delta_fit, held) else 'outside'} its 80 % band)")
    tol = SIGNIFICANT_SE * (held_mult.se or 0.0) + FLOAT_SLACK * max(1.0, abs(fit.pred))
    back = (f"held-out {name} {_m(held_mult)} at {sym}={sci(10 ** held_mult.x)}, predicted ×{10 ** fit.pred:.3g} "
            f"(80 % ×{10 ** lo:.3g}..×{10 ** hi:.3g}); {in_delta}; {curve.describe(sym)}")
    assert held_mult.log10 is not None
    if not lo - tol <= held_mult.log10 <= hi + tol:
        return Verdict("NOT-PREDICTIVE", f"ladder not predictive: {back}; nothing extrapolated", numbers)
    sign = 1.0 if held_mult.log10 >= 0 else -1.0
    slo, shi = fit.slope_interval
    per = f"log10 of the multiplier {fit.slope:+.3g} per decade of {unit} (80 % {slo:+.3g}..{shi:+.3g})"
    steps = ", ".join(_m(m).split(" (")[0] for m in [*usable, held_mult])
    if max(sign * slo, sign * shi) < 0 and fit.slope != 0:   # the whole interval points back toward ×1
        numbers["reaches_one_at"], where = zero_crossing(fit, held_mult.x, axis, ("reaches ×1", "would reach ×1"))
        return Verdict("SHRINKING", f"SHRINKING: the {name} falls toward ×1 ({steps}) and {where}; {per}; {back}",
                       numbers)
    if sign < 0:
        return Verdict("HOLDS", f"HOLDS (harmful at every scale): the {name} stays below ×1 ({steps}); {per}; {back}",
                       numbers)
    return Verdict("HOLDS", f"HOLDS: the {name} stays steady above ×1 or grows ({steps}); {per}; {back}", numbers)
