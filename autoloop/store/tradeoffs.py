"""Pure questions about the guards and the trade-offs, asked of a ledger.

The guards in force are the ones the latest judged record names (``extra.guards``, written
by the keep decision), so status, the report and the dashboard need nothing but the ledger;
breaches are the records' ``extra.guard_breaches``. The trade-offs are the night's non-crash
attempts as points (the metric against peak memory, against tokens per second) and their
Pareto front: the points no other point beats on both axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoloop.store.ledger import LedgerRecord

# The axes the morning looks at: (name, label, higher is better). tokens_per_second is read
# when printed, else derived from train.py's total_tokens_M and training_seconds.
AXES = (("peak_vram_mb", "peak memory (MB)", False), ("tokens_per_second", "tokens/s", True))
MAX_BREACHES_SHOWN = 5


@dataclass(frozen=True)
class Point:
    trial: int
    attempt: int
    metric: float
    x: float
    kept: bool          # a kept change (or the baseline): on the kept line
    front: bool = False

    @property
    def label(self) -> str:
        return f"#{self.trial}" + (f".{self.attempt}" if self.attempt > 1 else "")


def guards_in_force(records: Sequence[LedgerRecord]) -> list[str]:
    for r in reversed(records):
        if r.extra.get("guards"):
            return [str(g) for g in r.extra["guards"]]
    return []


def breached(records: Sequence[LedgerRecord]) -> list[LedgerRecord]:
    """The attempts a guard turned down (or that broke one while losing anyway), in order."""
    return [r for r in records if r.extra.get("guard_breaches")]


def guard_lines(records: Sequence[LedgerRecord], guards: Sequence[str] = ()) -> list[str]:
    """One line per guard: the guard, how many attempts broke it, the last few with their
    value and limit. ``guards``: the ones in force (else the ledger's)."""
    guards = list(guards) or guards_in_force(records)
    lines = []
    for guard in guards:
        hits = [(r, b) for r in breached(records) for b in r.extra["guard_breaches"] if b.get("guard") == guard]
        if not hits:
            lines.append(f"- `{guard}`: no breach so far")
            continue
        shown = ", ".join(f"#{r.trial}{'.' + str(r.attempt) if r.attempt > 1 else ''} "
                          f"({_num(b.get('value'))} vs {_num(b.get('limit'))})" for r, b in hits[-MAX_BREACHES_SHOWN:])
        lines.append(f"- `{guard}`: breached by {len(hits)} attempt{'s' if len(hits) != 1 else ''}: {shown}")
    return lines


def axis_value(r: LedgerRecord, name: str) -> float | None:
    m = r.metrics
    if name in m:
        return m[name]
    if name == "tokens_per_second" and m.get("total_tokens_M") and m.get("training_seconds"):
        return m["total_tokens_M"] * 1e6 / m["training_seconds"]
    return None


def points(records: Sequence[LedgerRecord], name: str, direction: str, higher_x: bool) -> list[Point]:
    """The night's non-crash attempts that printed the axis, the Pareto front marked."""
    pts = []
    for r in records:
        x = axis_value(r, name)
        if r.status not in ("keep", "discard") or r.kind == "verify" or r.metric is None or x is None:
            continue
        pts.append(Point(r.trial, r.attempt, r.metric, x, r.status == "keep"))
    sign = 1.0 if direction == "min" else -1.0
    xs = -1.0 if higher_x else 1.0

    def dominated(p: Point) -> bool:
        return any(sign * q.metric <= sign * p.metric and xs * q.x <= xs * p.x
                   and (q.metric != p.metric or q.x != p.x) for q in pts)

    return [Point(p.trial, p.attempt, p.metric, p.x, p.kept, not dominated(p)) for p in pts]


def front_data(records: Sequence[LedgerRecord], direction: str) -> list[dict[str, object]]:
    """For the dashboard: per axis with any point, its points (JSON-ready)."""
    out = []
    for name, label, higher in AXES:
        pts = points(records, name, direction, higher)
        if pts:
            out.append({"name": name, "label": label, "higher_is_better": higher,
                        "points": [{"label": p.label, "metric": p.metric, "x": p.x, "kept": p.kept,
                                    "front": p.front} for p in pts]})
    return out


def _num(value: object) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "-"
