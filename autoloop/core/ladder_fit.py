"""The statistics of `autoloop ladder`, pure: a change's Δ per rung, the fit of Δ against
log-compute, its backtest on the held-out rung, the verdict; and, for a change that only
moves a tuning constant, the optimum multiplier per rung and its exponent against size.

* **Δ at a rung**: the mean over the K seeds of (parent − change), sign-flipped when higher is
  better, so positive means the change helps; its standard error sd/√K, the sd of the
  differences pooled over every rung.
* **The fit**: weighted least squares of Δ on log10(compute), weights 1/SE² (an SE is floored
  at a tenth of the median SE, so a rung whose pairs agree exactly does not take all the
  weight); when the fit rungs scatter more than their SEs say (χ²/dof > 1) the SEs are
  inflated by √(χ²/dof) (the Birge ratio). Its 80 % interval: a parametric bootstrap, each
  rung's Δ redrawn from N(Δ, SE²) and the line refitted, the 10th and 90th percentiles.
* **The backtest**: the held-out rung's Δ must fall inside the line's 80 % interval at its
  compute, give or take 2 of its SEs; else the ladder is not predictive and nothing is
  extrapolated.
* **The axis**: log-compute where the runs' compute grows along the rungs (each at least
  COMPUTE_GROWTH times the one before), else log-parameters: a fixed wall-clock budget on a
  device whose throughput falls as the model grows gives every rung about the same compute
  (measured on a 2-core CPU: 4e11 to 5e11 FLOPs from DEPTH 1 to DEPTH 8), and a fit against
  a flat axis would extrapolate nothing real.
* **The optimum** of a swept constant at a rung: a parabola in log2(multiplier) through the
  mean metric of each multiplier, its vertex (clamped to the sweep); its SE from redrawing
  the means with the rung's pooled sd. The exponent: WLS of log10(optimum) on
  log10(parameters), bootstrapped alike.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)   # the sweep of a tuning constant, per rung
EXTRAPOLATION_CAP = 30.0                   # never a number beyond this many times the largest rung run
SIGNIFICANT_SE = 2.0                       # a Δ beyond this many SEs is a Δ
DRAWS = 2000                               # bootstrap draws
LOW_Q, HIGH_Q = 0.10, 0.90                 # the 80 % interval
COMPUTE_GROWTH = 1.25                      # compute is the axis only where each rung has this much more


@dataclass(frozen=True)
class RungDelta:
    x: float                 # log10 of the rung's place on the axis: compute (6·N·D), else parameters
    mean: float | None       # Δ, positive: the change helps
    se: float | None         # its standard error (None: fewer than two pairs)
    n: int

    @property
    def significant(self) -> bool:
        return self.mean is not None and self.se is not None and abs(self.mean) > SIGNIFICANT_SE * self.se


def rung_deltas(xs: Sequence[float], pairs: Sequence[Sequence[tuple[float, float]]],
                direction: str) -> list[RungDelta]:
    """Δ at each rung from its (parent, change) metric pairs, one per seed. The SE uses the
    sd of the differences pooled over the rungs (the measurement's noise, estimated on every
    pair): with K = 3 seeds a rung's own sd is too unsure for a 2-SE rule."""
    diffs = [[(p - c) if direction == "min" else (c - p) for p, c in rung] for rung in pairs]
    dof = sum(len(d) - 1 for d in diffs if len(d) >= 2)
    ss = sum(sum((v - statistics.fmean(d)) ** 2 for v in d) for d in diffs if len(d) >= 2)
    sd = math.sqrt(ss / dof) if dof > 0 else None
    return [RungDelta(x, statistics.fmean(d) if d else None,
                      sd / math.sqrt(len(d)) if d and sd is not None else None, len(d))
            for x, d in zip(xs, diffs, strict=True)]


def _floored(ses: Sequence[float]) -> list[float]:
    positive = [s for s in ses if s > 0]
    floor = 0.1 * statistics.median(positive) if positive else 1e-9
    return [max(s, floor, 1e-12) for s in ses]


def wls(xs: Sequence[float], ys: Sequence[float], ses: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the weighted least-squares line, weights 1/se²."""
    w = np.array([1.0 / s ** 2 for s in ses])
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    xm, ym = float(np.sum(w * x) / np.sum(w)), float(np.sum(w * y) / np.sum(w))
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx == 0:
        return ym, 0.0
    slope = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
    return ym - slope * xm, slope


def _interval(values: Sequence[float]) -> tuple[float, float]:
    q = np.quantile(np.asarray(values, float), [LOW_Q, HIGH_Q])
    return float(q[0]), float(q[1])


@dataclass(frozen=True)
class LineFit:
    intercept: float
    slope: float                          # per decade of x
    slope_interval: tuple[float, float]   # 80 %
    x_pred: float
    pred: float                           # at x_pred (the held-out rung)
    pred_interval: tuple[float, float]    # 80 %
    inflation: float = 1.0                # the Birge ratio applied to the SEs

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def _wls_rows(xs: Sequence[float], ys: np.ndarray, ses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """wls for each row of ys at once: (intercepts, slopes)."""
    w = np.array([1.0 / s ** 2 for s in ses])
    x = np.asarray(xs, float)
    xm = float(np.sum(w * x) / np.sum(w))
    ym = ys @ w / np.sum(w)
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx == 0:
        return ym, np.zeros_like(ym)
    slopes = (ys - ym[:, None]) @ (w * (x - xm)) / sxx
    return ym - slopes * xm, slopes


def fit_line(xs: Sequence[float], ys: Sequence[float], ses: Sequence[float], x_pred: float,
             seed: int = 0) -> LineFit:
    """The WLS line through (x, y ± se), and its bootstrap 80 % intervals (slope; value at x_pred)."""
    s = _floored(ses)
    a, b = wls(xs, ys, s)
    dof = len(xs) - 2
    chi2 = sum(((y - (a + b * x)) / e) ** 2 for x, y, e in zip(xs, ys, s, strict=True))
    inflation = math.sqrt(chi2 / dof) if dof > 0 and chi2 > dof else 1.0
    s = [e * inflation for e in s]
    rng = np.random.default_rng(seed)
    drawn = np.asarray(ys, float) + rng.standard_normal((DRAWS, len(ys))) * np.asarray(s)
    intercepts, slopes = _wls_rows(xs, drawn, s)
    return LineFit(a, b, _interval(list(slopes)), x_pred, a + b * x_pred,
                   _interval(list(intercepts + slopes * x_pred)), inflation)


def predictive(fit: LineFit, held: RungDelta) -> bool:
    """The backtest: the held-out Δ inside the predicted 80 % interval, give or take 2 of its SEs."""
    assert held.mean is not None
    tol = SIGNIFICANT_SE * (held.se or 0.0)
    lo, hi = fit.pred_interval
    return lo - tol <= held.mean <= hi + tol


# ------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class Verdict:
    name: str        # HOLDS | SHRINKING | SCALE-BOUND | NOISE | NOT-PREDICTIVE | RETUNE-AT-SCALE | INCOMPLETE
    line: str        # one line, with its numbers
    numbers: dict[str, float | None] = field(default_factory=dict)

    @property
    def unproven(self) -> bool:
        """What `finalize --drop-unproven` leaves out."""
        return self.name in ("SCALE-BOUND", "NOISE", "NOT-PREDICTIVE")


def sci(c: float) -> str:
    return f"{c:.3g}"


def _d(r: RungDelta) -> str:
    return f"{r.mean:+.4g} ± {r.se:.2g}" if r.mean is not None and r.se is not None else "-"


def along_compute(computes: Sequence[float]) -> bool:
    """Whether compute grows along the rungs enough to be the fit's axis (else parameters)."""
    return all(b >= COMPUTE_GROWTH * a for a, b in itertools.pairwise(computes))


# The axis's name in the verdict's numbers, its symbol in the lines, and its unit.
AXES = {"compute": ("C", "compute"), "params": ("N", "parameters")}


def zero_crossing(fit: LineFit, x_last: float, axis: str, verbs: tuple[str, str]) -> tuple[float | None, str]:
    """Where a fitted line reaches zero on the axis, and the words for it: a number only up to
    EXTRAPOLATION_CAP times the largest rung run (``x_last``), beyond that none. ``verbs``: what
    reaching zero is called there and beyond ("will vanish", "would vanish")."""
    sym, unit = AXES[axis]
    x0 = -fit.intercept / fit.slope
    cap = EXTRAPOLATION_CAP * 10 ** x_last
    if 10 ** x0 <= cap:
        return 10 ** x0, f"{verbs[0]} at about {unit} {sym}={sci(10 ** x0)}"
    return None, (f"{verbs[1]} beyond {EXTRAPOLATION_CAP:.0f}× the largest rung run ({sym}={sci(cap)}): "
                  "not extrapolated")


def early_verdict(fit_rungs: Sequence[RungDelta], held: RungDelta, axis: str = "compute") -> Verdict | None:
    """INCOMPLETE, NOISE or SCALE-BOUND, read on Δ before any fit (a sign that flips is a
    multiplier crossing ×1 in any currency); None when a fit is to decide."""
    sym, _ = AXES[axis]
    usable = [r for r in fit_rungs if r.mean is not None and r.se is not None]
    if len(usable) < 2 or held.mean is None or held.se is None:
        return Verdict("INCOMPLETE", "INCOMPLETE: fewer than two fit rungs or no held-out Δ with an SE yet")
    every = [*usable, held]
    if not any(r.significant for r in every):
        top = max(every, key=lambda r: abs(r.mean or 0) / max(r.se or 1e-12, 1e-12))
        return Verdict("NOISE", f"NOISE: no rung's Δ beyond 2 SE (the largest: {_d(top)} at {sym}={sci(10 ** top.x)})",
                       {"delta": top.mean, "se": top.se, axis: 10 ** top.x})
    plus = [r for r in every if r.significant and (r.mean or 0) > 0]
    minus = [r for r in every if r.significant and (r.mean or 0) < 0]
    if plus and minus:
        return Verdict("SCALE-BOUND", f"SCALE-BOUND: the sign flips inside the ladder: Δ {_d(plus[0])} at "
                       f"{sym}={sci(10 ** plus[0].x)}, {_d(minus[0])} at {sym}={sci(10 ** minus[0].x)}",
                       {f"plus_{axis}": 10 ** plus[0].x, f"minus_{axis}": 10 ** minus[0].x})
    return None


def delta_verdict(fit_rungs: Sequence[RungDelta], held: RungDelta, axis: str = "compute") -> Verdict:
    """The verdict of a plain change read on Δ alone: NOISE, SCALE-BOUND, not predictive,
    SHRINKING or HOLDS, its places on ``axis`` ("compute" or "params", the rungs' x). The
    ladder reads the compute multiplier instead where the parent's curve allows
    (core/compute_multiplier.py); this is its fallback."""
    early = early_verdict(fit_rungs, held, axis)
    if early is not None:
        return early
    sym, unit = AXES[axis]
    usable = [r for r in fit_rungs if r.mean is not None and r.se is not None]
    assert held.mean is not None and held.se is not None
    every = [*usable, held]
    fit = fit_line([r.x for r in usable], [r.mean for r in usable if r.mean is not None],
                   [r.se for r in usable if r.se is not None], held.x)
    numbers: dict[str, float | None] = {"slope": fit.slope, "slope_low": fit.slope_interval[0],
                                        "slope_high": fit.slope_interval[1], "predicted": fit.pred,
                                        "predicted_low": fit.pred_interval[0], "predicted_high": fit.pred_interval[1],
                                        "held_out": held.mean, "held_out_se": held.se}
    lo, hi = fit.pred_interval
    back = f"held-out Δ {_d(held)} at {sym}={sci(10 ** held.x)}, predicted {fit.pred:+.4g} (80 % {lo:+.4g}..{hi:+.4g})"
    if not predictive(fit, held):
        return Verdict("NOT-PREDICTIVE", f"ladder not predictive: {back}; nothing extrapolated", numbers)
    sign = 1.0 if sum((r.mean or 0) / (r.se or 1) ** 2 for r in every) > 0 else -1.0
    slo, shi = fit.slope_interval
    slope = f"slope {fit.slope:+.4g} per decade of {unit} (80 % {slo:+.4g}..{shi:+.4g})"
    if max(sign * slo, sign * shi) < 0:   # the slope's whole interval points back toward zero
        numbers["vanishes_at"], where = zero_crossing(fit, held.x, axis, ("will vanish", "would vanish"))
        return Verdict("SHRINKING", f"SHRINKING: {where}; {slope}; {back}", numbers)
    harmful = " (harmful at every scale)" if sign < 0 else ""
    return Verdict("HOLDS", f"HOLDS{harmful}: Δ steady or growing, {slope}; {back}", numbers)


# ------------------------------------------------------------------------------ a tuning constant's optimum


@dataclass(frozen=True)
class RungOptimum:
    log_params: float               # log10 of the rung's parameters
    log2_m: float                   # the optimum multiplier, log2
    se: float                       # its SE (log2)
    edge: bool                      # at the sweep's edge: the optimum may lie beyond
    draws: tuple[float, ...] = ()   # bootstrap draws of log2_m


def _vertices(ts: Sequence[float], ys: np.ndarray) -> np.ndarray:
    """The vertex of the least-squares parabola through each row of ys over ts, clamped to
    the sweep; a row with no bowl (c2 <= 0) takes its better end."""
    t = np.asarray(ts, float)
    c2, c1, _ = np.linalg.pinv(np.vander(t, 3)) @ ys.T
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.clip(-c1 / (2 * c2), t.min(), t.max())
    out: np.ndarray = np.where(c2 > 0, vertex, t[np.argmin(ys, axis=1)])
    return out


def rung_optimum(log_params: float, runs: dict[float, list[float]], direction: str, seed: int = 0) -> RungOptimum:
    """The multiplier with the best metric at one rung: runs maps each multiplier to its metrics."""
    mults = sorted(m for m, v in runs.items() if v)
    ts = [math.log2(m) for m in mults]
    sign = 1.0 if direction == "min" else -1.0
    means = np.array([sign * statistics.fmean(runs[m]) for m in mults])
    variances = [statistics.variance(runs[m]) for m in mults if len(runs[m]) >= 2]
    sd = math.sqrt(statistics.fmean(variances)) if variances else 0.0
    t = float(_vertices(ts, means[None, :])[0])
    rng = np.random.default_rng(seed)
    spread = np.array([sd / math.sqrt(len(runs[m])) for m in mults])
    draws = _vertices(ts, means + rng.standard_normal((DRAWS, len(mults))) * spread)
    return RungOptimum(log_params, t, float(np.std(draws)), t in (ts[0], ts[-1]), tuple(float(d) for d in draws))


@dataclass(frozen=True)
class ExponentFit:
    exponent: float                        # optimum multiplier ∝ params^exponent
    interval: tuple[float, float]          # 80 %
    intercept: float                       # log10 of the multiplier at 1 parameter

    def log10_m(self, log_params: float) -> float:
        return self.intercept + self.exponent * log_params


def fit_exponent(optima: Sequence[RungOptimum]) -> tuple[ExponentFit, list[tuple[float, float]]]:
    """The exponent of the optimum against parameters, and the bootstrap (intercept, slope) pairs."""
    xs = [o.log_params for o in optima]
    ys = [o.log2_m * math.log10(2) for o in optima]
    ses = _floored([o.se * math.log10(2) for o in optima])
    a, b = wls(xs, ys, ses)
    intercepts, slopes = _wls_rows(xs, np.array([o.draws for o in optima]).T * math.log10(2), ses)
    return ExponentFit(b, _interval(list(slopes)), a), list(zip(intercepts.tolist(), slopes.tolist(), strict=True))


def retune_verdict(constants: dict[str, float], fit_optima: Sequence[RungOptimum], held: RungOptimum,
                   target_log_params: float) -> Verdict:
    """RETUNE-AT-SCALE with the exponent and the value to use at the target size, or not
    predictive when the held-out rung's optimum disagrees with the fit."""
    if len(fit_optima) < 2:
        return Verdict("INCOMPLETE", "INCOMPLETE: fewer than two fit rungs swept")
    fit, lines = fit_exponent(fit_optima)
    lo, hi = fit.interval
    preds = [a + b * held.log_params for a, b in lines]
    plo, phi = _interval(preds)
    got = held.log2_m * math.log10(2)
    tol = SIGNIFICANT_SE * held.se * math.log10(2)
    numbers: dict[str, float | None] = {"exponent": fit.exponent, "exponent_low": lo, "exponent_high": hi,
                                        "held_out_multiplier": 2 ** held.log2_m,
                                        "predicted_multiplier": 10 ** fit.log10_m(held.log_params)}
    exp = f"the best multiplier ∝ N^{fit.exponent:+.3f} (80 % {lo:+.3f}..{hi:+.3f})"
    back = (f"held-out optimum ×{2 ** held.log2_m:.3g} at N={sci(10 ** held.log_params)}, predicted "
            f"×{10 ** fit.log10_m(held.log_params):.3g} (80 % ×{10 ** plo:.3g}..×{10 ** phi:.3g})")
    edges = " (an optimum at the sweep's edge: it may lie beyond)" if any(o.edge for o in [*fit_optima, held]) else ""
    if not plo - tol <= got <= phi + tol:
        return Verdict("NOT-PREDICTIVE", f"ladder not predictive: {exp}; {back}; nothing extrapolated{edges}", numbers)
    if target_log_params - held.log_params > math.log10(EXTRAPOLATION_CAP):
        return Verdict("RETUNE-AT-SCALE", f"RETUNE-AT-SCALE: {exp}; {back}; the target is beyond "
                       f"{EXTRAPOLATION_CAP:.0f}× the largest rung's parameters: not extrapolated{edges}", numbers)
    m = 10 ** fit.log10_m(target_log_params)
    tlo, thi = _interval([10 ** (a + b * target_log_params) for a, b in lines])
    use = ", ".join(f"{k} = {v * m:.4g} (80 % {v * tlo:.4g}..{v * thi:.4g})" for k, v in constants.items())
    numbers.update({"target_params": 10 ** target_log_params, "target_multiplier": m})
    return Verdict("RETUNE-AT-SCALE", f"RETUNE-AT-SCALE: {exp}; {back}; at N={sci(10 ** target_log_params)} use "
                   f"{use}{edges}", numbers)
