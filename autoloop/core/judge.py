"""Keep or discard: pure functions of a finished trial's metric and the best so far.

Crashes never reach here (the classifier decides those); this only judges a trial
that produced a metric.

The rule, in one place so that later rules slot in beside it:

* no best yet -> keep ("baseline");
* improvement = how much better than the best, in the configured direction
  (positive = better whether lower or higher is better);
* keep when improvement > threshold, else discard.

The threshold is ``min_delta`` today. A noise-aware rule ("beat best by more than
z x noise") enters through ``required_improvement`` (``noise`` and ``z``, off by
default), and a confirmation re-run would be a third outcome decided where the
threshold is compared; callers only see :class:`MetricVerdict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from autoloop.core.power import ConfirmCount, confirm_runs

Direction = Literal["min", "max"]


@dataclass(frozen=True)
class MetricVerdict:
    status: Literal["keep", "discard"]
    reason: str                 # one line, for the ledger and the log
    delta: float | None         # signed improvement over the best (positive = better); None: no best


def improvement(metric: float, best: float, direction: Direction) -> float:
    """How much better metric is than best: positive when better, in either direction."""
    if direction == "min":
        return best - metric
    if direction == "max":
        return metric - best
    raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")


def required_improvement(min_delta: float = 0.0, noise: float | None = None,
                         z: float = 0.0) -> tuple[float, str]:
    """The improvement a candidate must exceed, and a label saying where it comes from.

    The larger of min_delta and z x noise; noise and z default to off.
    """
    if min_delta < 0:
        raise ValueError(f"min_delta must be >= 0, got {min_delta}")
    threshold, label = min_delta, f"min_delta {_num(min_delta)}"
    if noise is not None and z > 0 and math.isfinite(noise) and z * noise > threshold:
        threshold, label = z * noise, f"{z:g} x noise {_num(noise)}"
    return threshold, label


def judge_metric(metric: float, best: float | None, direction: Direction = "min", min_delta: float = 0.0,
           *, noise: float | None = None, z: float = 0.0) -> MetricVerdict:
    """Keep the candidate when it beats best by MORE than the threshold (see module doc).

    A tie is never a keep: an unchanged metric is not worth a commit.
    """
    if direction not in ("min", "max"):
        raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
    threshold, label = required_improvement(min_delta, noise, z)
    if metric is None or not math.isfinite(metric):
        # Defensive: the runner turns these into crashes, but never keep one.
        return MetricVerdict("discard", f"metric is not a finite number ({metric})", None)
    if best is None:
        return MetricVerdict("keep", "baseline", None)
    if not math.isfinite(best):
        # A NaN best (an unusable baseline) would otherwise reject everything forever.
        return MetricVerdict("keep", f"best so far is {best}; a finite metric replaces it", None)

    delta = improvement(metric, best, direction)
    change = metric - best   # raw change of the metric, as the user reads the numbers
    if delta > threshold:
        return MetricVerdict("keep", f"improved by {_num(delta)} ({_num(metric)} vs best {_num(best)})", delta)
    if delta <= 0:
        return MetricVerdict("discard", f"no improvement ({_signed(change)} vs best {_num(best)})", delta)
    return MetricVerdict("discard", f"improvement {_num(delta)} <= {label}", delta)


def _num(x: float) -> str:
    # Four decimals reads well for bits per byte; tiny values keep their digits.
    if x != 0 and abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "") + _num(x)


# ---------------------------------------------------------------------------------------------
# Noise: the spread of repeated runs of one commit, and the keep rule that uses it.

KeepRule = Literal["noise", "strict"]


def noise_estimate(samples: list[float]) -> tuple[float | None, str]:
    """(sigma, method) of repeated runs of one commit (different seeds); None below 2 runs.

    The sample standard deviation (n - 1). With the 2-5 runs a night can afford, a
    robust estimate such as MAD x 1.4826 is worse, not better: with 3 runs the MAD is the
    distance of one point to the median and is 0 whenever two runs agree, which would
    make every tiny difference look significant. Outliers (one run crashed half-way
    and still reported) are rare and would inflate the stdev, which errs on the safe
    side (fewer false keeps).
    """
    xs = [x for x in samples if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return None, "stdev"
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return math.sqrt(var), "stdev"


def confidence(delta: float | None, noise: float | None) -> float | None:
    """Improvement over the noise estimate, in sigma (signed: negative = worse); None if unknown."""
    if delta is None or noise is None or not math.isfinite(noise) or noise <= 0 or not math.isfinite(delta):
        return None
    return delta / noise


def effective_rule(rule: str, noise: float | None) -> KeepRule:
    """'auto' is 'noise' once a usable noise estimate exists, else 'strict'."""
    if rule == "auto":
        return "noise" if noise is not None and math.isfinite(noise) and noise > 0 else "strict"
    if rule == "noise":
        return "noise"
    if rule == "strict":
        return "strict"
    raise ValueError(f"keep rule must be 'noise', 'strict' or 'auto', got {rule!r}")


@dataclass(frozen=True)
class Judgement:
    status: Literal["keep", "discard", "confirm"]   # confirm: run again with a new seed, then judge again
    reason: str
    delta: float | None          # improvement of the MEAN of the runs over the best
    mean: float | None           # mean of the runs: the candidate's value if kept
    confidence: float | None     # delta / noise, in sigma
    rule: KeepRule
    count: ConfirmCount | None = None   # a confirmation chosen from power: the runs it asks for and why


def judge_runs(runs: list[float], best: float | None, direction: Direction = "min", min_delta: float = 0.0,
               *, noise: float | None = None, z: float = 2.0, rule: str = "auto",
               can_confirm: bool = True,
               sanity_bound: float = 0.0, power: float | None = None, best_runs: int = 1,
               planned: int | None = None) -> Judgement:
    """Keep, discard or confirm a candidate from the metrics of its runs (one or more seeds).

    strict: keep when the mean improves on the best by more than min_delta (autoresearch).
    noise:  keep when it improves by more than max(min_delta, z x noise); an improvement
            that is positive but not above that threshold is confirmed (``confirm``, only
            while ``can_confirm`` and the candidate has a single run): run again with new
            seeds and then kept only if the mean of its n runs clears
            max(min_delta, z x noise / sqrt(n)), else discarded as ``within noise``.

    How many runs a confirmation asks for: with ``power`` and a noise estimate, the count
    core/power.confirm_runs chooses for the first run's gain against a best that is the
    mean of ``best_runs`` runs (the Judgement's ``count``); otherwise one re-run (no noise
    measured: nothing to choose a count from; ``power`` None: as before the count existed).

    ``planned``: a confirmation under way asks for this many runs in all. Before the last
    of them the mean is never kept (a keep at an interim look would be a second chance at
    a lucky mean: more false keeps than the bar says); it is discarded early only when the
    mean is no better than the best at all, which can only turn keeps into discards, never
    add a false keep. Otherwise ``confirm`` again.
    """
    # Sanity bound, under any rule: a first run that beats the best by more than
    # sanity_bound x |best| is more often a broken measurement (a leak into the validation
    # data, a metric computed on the wrong bytes) than a breakthrough. It is re-run once
    # (while can_confirm), and afterwards kept only if the re-run by itself beats the best
    # too; then the mean must still clear the usual rule below. 0 turns it off.
    if sanity_bound > 0 and best is not None and math.isfinite(best) and runs and runs[0] is not None:
        bound = sanity_bound * abs(best)
        first = improvement(runs[0], best, direction)
        if first > bound:
            used = effective_rule(rule, noise)
            finite = [x for x in runs if x is not None and math.isfinite(x)]
            mean = sum(finite) / len(finite) if finite else float("nan")
            delta = improvement(mean, best, direction)
            if len(runs) == 1 and can_confirm:
                return Judgement("confirm", f"suspiciously large gain ({_num(first)} > sanity bound "
                                 f"{sanity_bound:g} x |best| = {_num(bound)}): confirming with a re-run",
                                 delta, mean, confidence(delta, noise), used)
            last = runs[-1]
            if len(runs) > 1 and not (last is not None and improvement(last, best, direction) > 0):
                return Judgement("discard", f"the re-run did not reproduce a suspiciously large gain "
                                 f"(re-run {_num(last) if last is not None else last} vs best {_num(best)})",
                                 delta, mean, confidence(delta, noise), used)
    used = effective_rule(rule, noise)
    xs = [x for x in runs if x is not None]
    mean = sum(xs) / len(xs) if xs else float("nan")
    # The mean of n runs is noisier by sigma / sqrt(n), not sigma: a second run must not be
    # held to the single-run bar, or a real gain of one sigma would almost never survive
    # its confirmation (P ~ 8 % at z 2 instead of ~ 28 %).
    mean_noise = noise / math.sqrt(len(xs)) if noise is not None and xs else noise
    if used == "strict":
        d = judge_metric(mean, best, direction, min_delta)
    else:
        d = judge_metric(mean, best, direction, min_delta, noise=mean_noise, z=z)
    conf = confidence(d.delta, noise)
    if planned is not None and len(xs) < planned and d.delta is not None:
        if d.delta <= 0:
            return Judgement("discard", f"within noise (mean of {len(xs)} runs improves by {_num(d.delta)}: no "
                             f"better than the best {_num(best) if best is not None else best}; stopped at "
                             f"{len(xs)} of {planned} runs)", d.delta, mean, conf, used)
        return Judgement("confirm", f"mean of {len(xs)} runs improves by {_num(d.delta)}: {len(xs)} of {planned} "
                         "runs, confirming on (judged once, on the mean of all)", d.delta, mean, conf, used)
    if d.status == "keep" or d.delta is None or d.delta <= 0 or used == "strict":
        reason = d.reason if len(xs) < 2 or d.delta is None else f"mean of {len(xs)} runs: {d.reason}"
        return Judgement(d.status, reason, d.delta, mean, conf, used)
    threshold, label = required_improvement(min_delta, mean_noise, z)
    if can_confirm and len(xs) == 1:
        if power is None:
            how = "confirming with a re-run"
        elif noise is None or not math.isfinite(noise) or noise <= 0:
            how = "confirming with a re-run (no noise measured: one re-run, not a count from --power)"
        else:
            count = confirm_runs(d.delta, noise, best_runs, power, z, min_delta)
            return Judgement("confirm", f"within noise ({_num(d.delta)} <= {label}): {count.text()}",
                             d.delta, mean, conf, used, count)
        return Judgement("confirm", f"within noise ({_num(d.delta)} <= {label}): {how}", d.delta, mean, conf, used)
    return Judgement("discard", f"within noise (mean of {len(xs)} runs improves by {_num(d.delta)} <= {label})",
                     d.delta, mean, conf, used)
