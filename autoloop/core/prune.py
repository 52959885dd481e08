"""Pruning against the best's curve (--prune): pure rules (docs/fidelity.md).

A trial prints its smoothed train loss as it trains (train.py's progress lines). The best's
own runs printed theirs: their mean is the best's *curve*, loss against elapsed training
seconds, and the spread of repeated runs of one commit about their mean is the curve's
*noise*. A running trial whose loss sits above the best's curve at the same elapsed time by
more than ``BAND_Z`` noise sigmas (and by at least ``MIN_BAND`` of the loss), past
``WARMUP_SHARE`` of the budget, on ``CONFIRM_LINES`` progress lines in a row, is stopped:
it is recorded as pruned, neither a crash nor a discard by metric, and never kept.

Elapsed time is the budget's own currency: a change that makes steps slower loses steps in a
fixed budget, and is behind for it. What must not count against a change is the *machine*
going slower (a neighbour's job). Where the machine's speed is measured beside the run and
beside the best's (execution/machine_speed.py, local trials), the best's loss is read at the
time the best needed for the work this machine allowed: ``t x speed / best's speed`` (never
later than ``t``). Where it is not (a trial on a cluster's node), a run behind in time must
also be behind at the same step: that spares a slower machine, and also spares a change that
only makes steps slower (the safe side: it trains to the end).

The danger is a change that is behind mid-run and wins at the end: a longer warmup, a later
decay. The defaults come from real train.py curves of this project's CPU (benchmarks/data/
prune_curves.json, replayed by benchmarks/prune.py); and the rule checks itself as the night
goes, as scouting does: for every trial that ran to the end, (its gap to the best's curve at
the warm-up share, its final gap to its parent) is a pair, and once ``scout.MIN_PAIRS`` pairs
rank with a Spearman below ``scout.RHO_FLOOR`` the early loss no longer tells the end and
pruning turns itself off for the rest of the night.

The engine (engine/prune.py) and benchmarks/prune.py call these same functions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from autoloop.core.scout import Agreement, agreement, pooled_sigma, switched_off

Curve = tuple[tuple[float, float], ...]   # (elapsed training seconds, smoothed train loss), time rising

# The share of the budget before which no trial is pruned, and the band's width in curve-noise
# sigmas. Chosen on 756 pairs of 28 real train.py runs of this machine (benchmarks/prune.py:
# every recorded run held against every other as the best; the train loss at 30 % of the
# budget ranks the final val_bpb at a Spearman of 0.90, at 50 % 0.95): among the rules that
# stopped no run that ended better than its best, this one saved the most training (13.8 %;
# from 50 % 7.4 %, at 2 sigma 1.6 %). The same rule without the slope projection stopped a
# longer warmup (WARMUP_FRAC 0.25) at 14 s of 40 that ended better than its best; a band of
# 1 % of the loss alone (no sigma) made one prune in ten false. The repeats there ran under a
# load of 0.2 to 12 on 2 cores: their curve noise, 0.20 nats, holds the machine's swings.
WARMUP_SHARE = 0.3
BAND_Z = 1.0
# The band is never narrower than this share of the best's loss: with two repeats of the
# best the curve noise can come out near zero by luck.
MIN_BAND = 0.01
# Progress lines in a row beyond the band before a trial is stopped: one line may be a spike.
CONFIRM_LINES = 2
# Whether the gap must also stay beyond the band when carried to the end of the budget along
# its recent slope: a change of schedule closes its gap fast once its own decay starts, a
# change that loses does not. TREND_LINES: the progress lines the slope is fitted over.
PROJECT = True
TREND_LINES = 5
# Nats per bit: train.py prints its train loss in nats per byte, the metric is in bits per byte.
NATS_PER_BIT = math.log(2)
# Points a stored curve keeps (thinned evenly): a 5-minute run prints 60 lines at 5 s.
MAX_POINTS = 120


def thin(points: Sequence[tuple[float, ...]], limit: int = MAX_POINTS) -> tuple[tuple[float, ...], ...]:
    """At most ``limit`` points, evenly picked, the last one always kept."""
    pts = [tuple(float(x) for x in p) for p in points if all(math.isfinite(x) for x in p)]
    if len(pts) <= limit:
        return tuple(pts)
    every = (len(pts) - 1) / (limit - 1)
    return tuple(pts[round(i * every)] for i in range(limit))


def loss_at(curve: Curve, t: float) -> float | None:
    """The curve's loss at ``t`` seconds, linearly between its points; None outside them."""
    if not curve or t < curve[0][0] or t > curve[-1][0]:
        return None
    i = bisect_left([p[0] for p in curve], t)
    if curve[i][0] == t or i == 0:
        return curve[i][1]
    (t0, v0), (t1, v1) = curve[i - 1], curve[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """The mean of repeated runs' curves, at every run's points within the span all of them
    cover (runs whose lines fall at other times are interpolated, none is cut short)."""
    curves = [c for c in curves if c]
    if not curves:
        return ()
    lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    out = []
    for t in sorted({p[0] for c in curves for p in c if lo <= p[0] <= hi}):
        values = [loss_at(c, t) for c in curves]
        out.append((t, sum(v for v in values if v is not None) / len(values)))
    return tuple(out)


def curve_noise(groups: Sequence[Sequence[Curve]], from_s: float = 0.0) -> float | None:
    """The curve's noise: the pooled standard deviation of repeated runs of one commit (each
    group one commit's curves, different seeds) at matched times from ``from_s`` on, the
    deviations at each time pooled over the times and the commits; None until some commit
    has two curves."""
    samples: list[list[float]] = []
    for curves in groups:
        curves = [c for c in curves if c]
        if len(curves) < 2:
            continue
        for t, _ in curves[0]:
            if t < from_s:
                continue
            values = [loss_at(c, t) for c in curves]
            if all(v is not None for v in values):
                samples.append([v for v in values if v is not None])
    return pooled_sigma(samples)


@dataclass(frozen=True)
class PruneRef:
    """What a running trial is held against: the best's curve and its noise (in nats), and the
    best's loss against its step count (``steps``: (step, loss); empty where not known)."""

    curve: Curve = ()
    sigma: float | None = None        # the curve noise; None: none measured
    budget_s: float = 0.0
    steps: Curve = ()
    speed: float | None = None        # the machine's speed beside the best's runs; None: not measured

    def pace(self, speed: float | None) -> float | None:
        """The machine's pace for a run at ``speed`` against the best's, at most 1 (a faster
        machine is not held against the run); None where either speed is unknown."""
        if speed is None or self.speed is None or not speed > 0 or not self.speed > 0:
            return None
        return min(1.0, speed / self.speed)

    def best_at(self, t: float, speed: float | None = None) -> tuple[float | None, float | None]:
        """(the best's loss a run at ``t`` s on a machine at ``speed`` is held against, the
        pace it was read at; None where the speed is unknown)."""
        pace = self.pace(speed)
        return loss_at(self.curve, t * (pace or 1.0)), pace

    def band(self, loss: float, z: float = BAND_Z) -> float:
        """How far above the best's loss at a time a trial may be and still train on."""
        return max(z * (self.sigma or 0.0), MIN_BAND * loss)


@dataclass(frozen=True)
class PruneVerdict:
    beyond: bool        # this point is beyond the band
    reason: str
    gap: float | None   # the trial's loss minus the best's at the same time (nats)


def judge_point(t: float, loss: float, ref: PruneRef, share: float = WARMUP_SHARE,
                z: float = BAND_Z, step: float | None = None, speed: float | None = None) -> PruneVerdict:
    """One progress point of a running trial against the best's curve (``speed``: the
    machine's beside the run so far, where measured). With the machine's speed known, the
    best's loss is read at the time the best needed for the work this machine allowed. Without
    it, behind at the same elapsed time is not enough where the step is known: the run must be
    behind the best at the same step too. Both guard against a slower machine: in the first
    real --prune night on this shared machine a best measured in a quiet spell had every later
    trial stopped at 20 s of 40 on elapsed time alone. Only the first also stops a change that
    makes steps slower: on the third night (idle machine) the step check spared WIDTH 128 -> 256,
    0.36 nats behind at 20 s, level at the same step, 0.25 bpb worse at the end."""
    if ref.budget_s <= 0 or t < share * ref.budget_s:
        return PruneVerdict(False, "before the warm-up share", None)
    best, pace = ref.best_at(t, speed)
    if best is None or not math.isfinite(loss):
        return PruneVerdict(False, "no point of the best's curve here", None)
    gap, band = loss - best, ref.band(best, z)
    when = f"{t:.0f} s"
    if pace is not None and pace < 0.995:
        when += f" (the machine at {pace:.2f} of the best's pace)"
    shown = (f"train loss {loss:.4f} at {when} of {ref.budget_s:.0f} s vs the best's {best:.4f}: "
             f"{gap:+.4f}, band {band:.4f}")
    if pace is not None:
        return PruneVerdict(gap > band, shown, gap)
    at_step = loss_at(ref.steps, step) if step is not None and ref.steps else None
    if gap > band and at_step is not None and loss - at_step <= band:
        return PruneVerdict(False, f"{shown}; at step {step:.0f} {loss - at_step:+.4f}: fewer steps, not worse ones",
                            gap)
    return PruneVerdict(gap > band, shown, gap)


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of (t, value) points; None for fewer than two distinct times."""
    if len(points) < 2:
        return None
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    stt = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / stt if stt > 0 else None


class Watch:
    """The rule over one trial's progress points: pruned after ``confirm`` lines in a row beyond
    the band (with ``project``, the gap carried to the end along its recent slope beyond it
    too). Not thread-safe by itself: one reader thread feeds it."""

    def __init__(self, ref: PruneRef, share: float = WARMUP_SHARE, z: float = BAND_Z,
                 confirm: int = CONFIRM_LINES, project: bool = PROJECT):
        self.ref, self.share, self.z, self.confirm, self.project = ref, share, z, confirm, project
        self.points: list[tuple[float, float]] = []
        self.gaps: list[tuple[float, float]] = []
        self.run = 0
        self.verdict: PruneVerdict | None = None   # set once: the point that pruned it

    def see(self, t: float, loss: float, step: float | None = None, speed: float | None = None) -> bool:
        """Add a point (``step``: the run's step count there, where known; ``speed``: the
        machine's beside the run so far, where measured); True the first time the trial is to
        be stopped."""
        self.points.append((t, loss))
        best, _ = self.ref.best_at(t, speed)
        if best is not None and math.isfinite(loss):
            self.gaps.append((t, loss - best))
        if self.verdict is not None:
            return False
        v = judge_point(t, loss, self.ref, self.share, self.z, step, speed)
        if v.beyond and self.project and v.gap is not None:
            trend = slope(self.gaps[-TREND_LINES:])
            end = v.gap + (trend or 0.0) * max(0.0, self.ref.budget_s - t)
            band = self.ref.band(loss - v.gap, self.z)
            if end <= band:
                v = PruneVerdict(False, f"{v.reason}; closing: {end:+.4f} at the end on its slope", v.gap)
            else:
                v = PruneVerdict(True, f"{v.reason}; {end:+.4f} at the end on its slope", v.gap)
        self.run = self.run + 1 if v.beyond else 0
        if self.run >= self.confirm:
            self.verdict = v
            return True
        return False


def partial_gap(curve: Curve, ref: PruneRef, share: float = WARMUP_SHARE) -> float | None:
    """A finished trial's gap to the best's curve at the warm-up share (the rule's first look)."""
    t = share * ref.budget_s
    mine, best = loss_at(curve, t), loss_at(ref.curve, t)
    return None if mine is None or best is None else mine - best


def rank_agreement(pairs: Sequence[tuple[float, float]]) -> Agreement:
    """How well the early gap ranks the final one (scouting's Spearman)."""
    return agreement(pairs)


def rule_off(pairs: Sequence[tuple[float, float]]) -> Agreement | None:
    """The agreement at which the rule turned itself off (one-way, as scouting's); None: on."""
    return switched_off(pairs)
