"""Throughput per attempt: tokens/s over all ranks and MFU, for `autoloop status` and the report.

The figures are train.py's own (its summary block, recorded in the ledger): tokens per
second of training over all ranks, and MFU against the ranks' dense bf16 peak. A device
whose peak train.py does not know (a CPU, an unlisted GPU) says "unknown peak", never 0.
"""

from __future__ import annotations

from autoloop.store.ledger import LedgerRecord, trial_label


def throughput_text(record: LedgerRecord) -> str | None:
    """'12,345 tok/s, MFU 41.2 % on 2 ranks', or None when the attempt reported no tokens/s."""
    if record.tokens_per_s is None:
        return None
    mfu = f"MFU {record.mfu_percent:.1f} %" if record.mfu_percent is not None else "MFU unknown peak"
    ranks = f" on {record.world_size} ranks" if record.world_size > 1 else ""
    return f"{record.tokens_per_s:,.0f} tok/s, {mfu}{ranks}"


def status_lines(records: list[LedgerRecord], last: int = 5) -> list[str]:
    """`autoloop status`: the throughput of the last attempts that reported one."""
    shown = [(r, text) for r in records if (text := throughput_text(r))][-last:]
    if not shown:
        return []
    return ["throughput: " + "; ".join(f"#{trial_label(r.trial, r.attempt)} {text}" for r, text in shown)]


def throughput_section(records: list[LedgerRecord]) -> list[str]:
    """The report's table: every attempt that reported its throughput."""
    rows = [r for r in records if r.tokens_per_s is not None]
    if not rows:
        return []
    out = ["## Throughput", "", "| attempt | ranks | tokens/s | MFU |", "|---|---|---|---|"]
    for r in rows:
        mfu = f"{r.mfu_percent:.1f} %" if r.mfu_percent is not None else "unknown peak"
        out.append(f"| #{trial_label(r.trial, r.attempt)} | {r.world_size} | {r.tokens_per_s:,.0f} | {mfu} |")
    return [*out, ""]
