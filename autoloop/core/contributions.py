"""How much a kept change is worth, with an interval: pure functions of verification runs.

``autoloop verify`` runs R repeats of several variants of the target (the best, the
baseline, the best with one kept change taken out, ...). Repeat r of every variant gets
the same new seed, so the runs come in *pairs* across variants: what the seed does to a run
(its data order, its initialisation) is shared by both sides of a comparison and cancels in
their difference.

The contribution of a change is the paired mean difference

    d_r = s * (without_r - best_r)        s = +1 when lower is better (val_bpb), -1 when higher is
    contribution = mean(d_1 .. d_n)       over the n repeats where both runs produced a metric

(positive: the change helps), and its 95 % interval is Student's t-interval of that mean,

    contribution +- t(0.975, n - 1) * stdev(d) / sqrt(n).

A verdict reads the interval: ``confirmed`` when it lies wholly on the helping side of
zero, ``harmful`` when wholly on the hurting side, ``within noise`` when it contains zero
(the data cannot tell the change from no change), and ``unproven`` with fewer than two
pairs (no interval at all). The gain of the best over the baseline is the same formula with
the baseline in place of "without".

A transfer (the same variants at a larger scale) ``holds`` when the gain at scale is
``confirmed`` by the same rule; its ratio to the small-scale gain is shown beside it.

Only the standard library: the t quantiles are a table (two-sided 95 %), the rest is
``statistics``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["confirmed", "within noise", "harmful", "unproven"]

# Student's t, 0.975 quantile, by degrees of freedom (1..30); beyond 30 the normal's 1.96
# is within 2 % of it.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("an interval needs at least two pairs")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Estimate:
    """A paired mean difference, its 95 % half-width (None: fewer than two pairs) and verdict."""

    mean: float | None
    half: float | None
    n: int
    verdict: Verdict

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean + self.half

    def text(self, digits: int = 4) -> str:
        """'0.1234 +- 0.0050' (or '0.1234' alone, or '-' without a pair)."""
        if self.mean is None:
            return "-"
        return f"{self.mean:.{digits}f}" + ("" if self.half is None else f" +- {self.half:.{digits}f}")


def paired(worse: dict[int, float], better: dict[int, float], direction: str = "min") -> Estimate:
    """How much better ``better`` is than ``worse``: runs keyed by repeat, paired on the key
    (a repeat missing on either side, a crash, is left out)."""
    sign = 1.0 if direction == "min" else -1.0
    diffs = [sign * (worse[r] - better[r]) for r in sorted(set(worse) & set(better))
             if math.isfinite(worse[r]) and math.isfinite(better[r])]
    n = len(diffs)
    if n == 0:
        return Estimate(None, None, 0, "unproven")
    mean = statistics.fmean(diffs)
    if n < 2:
        return Estimate(mean, None, n, "unproven")
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    verdict: Verdict = "confirmed" if mean - half > 0 else "harmful" if mean + half < 0 else "within noise"
    return Estimate(mean, half, n, verdict)


def ratio(at_scale: Estimate, small: Estimate) -> float | None:
    """The gain at scale as a fraction of the gain at the night's scale (None: not defined)."""
    if at_scale.mean is None or small.mean is None or small.mean == 0:
        return None
    return at_scale.mean / small.mean
