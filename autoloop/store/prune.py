"""Questions asked of a ledger about pruning (--prune; core/prune.py's rules).

Pure functions of the records, like queries.py: a record's curve, the best's reference (its
runs' mean curve and the curve noise), the (early gap, final gap) pairs of the trials that
ran to the end, and a summary for status, the report and the dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoloop.core.prune import (
    NATS_PER_BIT,
    WARMUP_SHARE,
    Curve,
    PruneRef,
    curve_noise,
    mean_curve,
    partial_gap,
    rank_agreement,
    rule_off,
)
from autoloop.core.scout import Agreement
from autoloop.store.ledger import LedgerRecord


def _points(record: LedgerRecord) -> list[tuple[float, ...]]:
    raw = record.extra.get("curve")
    if not isinstance(raw, list):
        return []
    return [tuple(float(v) for v in p) for p in raw
            if isinstance(p, (list, tuple)) and len(p) in (2, 3)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)]


def curve_of(record: LedgerRecord) -> Curve:
    """The record's curve (extra.curve: [s, loss] or [s, loss, step]) as (s, loss); () when it
    has none or it is malformed."""
    return tuple(sorted((p[0], p[1]) for p in _points(record)))


def steps_of(record: LedgerRecord) -> Curve:
    """The record's loss against its step count, (step, loss); () for a curve without steps."""
    return tuple(sorted((p[2], p[1]) for p in _points(record) if len(p) == 3))


def _full_run(r: LedgerRecord) -> bool:
    """A run that trained its whole budget with a metric: its curve is a whole curve."""
    return (r.status in ("keep", "discard") and r.metric is not None and r.fidelity == "full"
            and r.kind not in ("verify", "scout"))


def curves_by_commit(records: Sequence[LedgerRecord]) -> dict[str, list[Curve]]:
    out: dict[str, list[Curve]] = {}
    for r in records:
        curve = curve_of(r)
        if r.commit and curve and _full_run(r):
            out.setdefault(r.commit, []).append(curve)
    return out


def reference(records: Sequence[LedgerRecord], commit: str | None, budget_s: float,
              noise: float | None = None) -> PruneRef:
    """What a trial built on ``commit`` is held against: the mean curve of that commit's whole
    runs (and the machine's mean speed beside them, where measured), and the curve noise
    pooled over every commit run more than once (from the warm-up share on); without
    repeats, the metric's noise in nats (``noise``, bits per byte), a stand-in: the train
    loss is smoothed and is not the held-out loss."""
    groups = curves_by_commit(records)
    curves = groups.get(commit or "", [])
    sigma = curve_noise(list(groups.values()), WARMUP_SHARE * budget_s)
    if sigma is None and noise is not None:
        sigma = noise * NATS_PER_BIT
    steps = [c for r in records if r.commit == commit and commit and _full_run(r) and (c := steps_of(r))]
    speeds = [r.machine_speed for r in records if r.commit == commit and commit and _full_run(r)
              and r.machine_speed is not None and curve_of(r)]
    return PruneRef(mean_curve(curves), sigma, budget_s, mean_curve(steps),
                    sum(speeds) / len(speeds) if speeds else None)


def _metric_of(records: Sequence[LedgerRecord], commit: str | None) -> float | None:
    runs = [r.metric for r in records if r.commit == commit and commit and _full_run(r) and r.metric is not None]
    return sum(runs) / len(runs) if runs else None


def pairs(records: Sequence[LedgerRecord], budget_s: float) -> list[tuple[float, float]]:
    """(gap to its parent's curve at the warm-up share, final metric minus its parent's) of each
    candidate or fix that trained to the end, in ledger order: how well the early look ranks."""
    out = []
    for i, r in enumerate(records):
        if r.kind not in ("candidate", "fix") or not _full_run(r) or r.metric is None or not r.parent:
            continue
        curve = curve_of(r)
        before = records[:i]
        parent_metric = _metric_of(before, r.parent)
        ref = reference(before, r.parent, budget_s)
        gap = partial_gap(curve, ref) if curve and ref.curve else None
        if gap is not None and parent_metric is not None:
            out.append((gap, r.metric - parent_metric))
    return out


def is_pruned(record: LedgerRecord) -> bool:
    return record.status == "pruned"


def saved_seconds(record: LedgerRecord) -> float:
    """The training seconds a pruned run did not spend: its budget less where it was stopped."""
    prune = record.extra.get("prune") or {}
    at, budget = prune.get("at_s"), prune.get("budget_s")
    if isinstance(at, (int, float)) and isinstance(budget, (int, float)):
        return max(0.0, float(budget) - float(at))
    return 0.0


@dataclass(frozen=True)
class Pruning:
    """A night's pruning, as status, the report and the dashboard show it."""

    pruned: int
    saved_seconds: float         # training seconds the pruned runs did not spend
    watched: int                 # candidates and fixes that trained with the rule on (pruned included)
    agreement: Agreement
    off: Agreement | None        # the agreement that turned the rule off; None: still on

    def line(self) -> str:
        state = f"turned off ({self.off.line().replace('promoted', 'completed')})" if self.off else "on"
        return (f"pruning: {self.pruned} of {self.watched} trials pruned, {self.saved_seconds / 60:.1f} min of "
                f"training saved; {self.agreement.line().replace('promoted', 'completed')}; rule {state}")


def pruning(records: Sequence[LedgerRecord], budget_s: float | None) -> Pruning | None:
    """None for a night that never pruned nor stored a curve."""
    pruned = [r for r in records if is_pruned(r)]
    if not pruned and not any(curve_of(r) for r in records):
        return None
    found = pairs(records, budget_s or 0.0)
    watched = sum(1 for r in records if r.kind in ("candidate", "fix") and (is_pruned(r) or curve_of(r)))
    return Pruning(len(pruned), sum(saved_seconds(r) for r in pruned), watched, rank_agreement(found),
                   rule_off(found))
