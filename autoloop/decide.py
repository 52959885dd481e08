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
threshold is compared; callers only see :class:`Decision`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Direction = Literal["min", "max"]


@dataclass(frozen=True)
class Decision:
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


def decide(metric: float, best: float | None, direction: Direction = "min", min_delta: float = 0.0,
           *, noise: float | None = None, z: float = 0.0) -> Decision:
    """Keep the candidate when it beats best by MORE than the threshold (see module doc).

    A tie is never a keep: an unchanged metric is not worth a commit.
    """
    if direction not in ("min", "max"):
        raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
    threshold, label = required_improvement(min_delta, noise, z)
    if metric is None or not math.isfinite(metric):
        # Defensive: the runner turns these into crashes, but never keep one.
        return Decision("discard", f"metric is not a finite number ({metric})", None)
    if best is None:
        return Decision("keep", "baseline", None)
    if not math.isfinite(best):
        # A NaN best (an unusable baseline) would otherwise reject everything forever.
        return Decision("keep", f"best so far is {best}; a finite metric replaces it", None)

    delta = improvement(metric, best, direction)
    change = metric - best   # raw change of the metric, as the user reads the numbers
    if delta > threshold:
        return Decision("keep", f"improved by {_num(delta)} ({_num(metric)} vs best {_num(best)})", delta)
    if delta <= 0:
        return Decision("discard", f"no improvement ({_signed(change)} vs best {_num(best)})", delta)
    return Decision("discard", f"improvement {_num(delta)} <= {label}", delta)


def _num(x: float) -> str:
    # Four decimals reads well for bits per byte; tiny values keep their digits.
    if x != 0 and abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "") + _num(x)
