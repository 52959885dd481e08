"""The morning's view of the guards and the trade-offs: report.md sections and status lines.

The facts are the ledger's (``store.tradeoffs``): the guards in force and their breaches,
and per axis (peak memory, tokens/s) the night's non-crash attempts with the Pareto front of
the metric against it, the kept line marked.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoloop.store.ledger import LedgerRecord
from autoloop.store.tradeoffs import AXES, guard_lines, guards_in_force, points

MAX_ROWS = 15   # front points listed per axis (the best by the metric first)


def guards_section(records: Sequence[LedgerRecord]) -> list[str]:
    """## Guards: each guard in force and the attempts that broke it (none: no section)."""
    if not guards_in_force(records):
        return []
    return ["## Guards", "", "A keep needed the metric better and every guard holding.", "",
            *guard_lines(records), ""]


def tradeoffs_section(records: Sequence[LedgerRecord], metric: str, direction: str) -> list[str]:
    """## Trade-offs: per axis, the front of the metric against it (kept attempts marked)."""
    out: list[str] = []
    for name, label, higher in AXES:
        pts = points(records, name, direction, higher)
        front = sorted((p for p in pts if p.front), key=lambda p: p.metric if direction == "min" else -p.metric)
        if len(pts) < 2 or not front:
            continue
        better = "higher" if higher else "lower"
        out += [f"### {metric} against {label}", "",
                f"{len(pts)} non-crash attempts; {len(front)} on the front (no other attempt is better on both; "
                f"{better} {label} is better). Kept: on the kept line.", "",
                f"| attempt | {metric} | {label} | kept |", "|---|---|---|---|"]
        out += [f"| {p.label} | {p.metric:.6f} | {p.x:g} | {'kept' if p.kept else ''} |" for p in front[:MAX_ROWS]]
        kept_off = [p.label for p in pts if p.kept and not p.front]
        if kept_off:
            out += ["", "Kept but off the front: " + ", ".join(kept_off)]
        out.append("")
    return (["## Trade-offs", ""] + out) if out else []

