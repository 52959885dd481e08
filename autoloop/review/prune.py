"""A --prune night's pruning, for status, the report and the dashboard (store/prune.py)."""

from __future__ import annotations

from autoloop.core.prune import BAND_Z, CONFIRM_LINES, WARMUP_SHARE
from autoloop.core.scout import MIN_PAIRS, RHO_FLOOR
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord
from autoloop.store.prune import is_pruned, pruning, saved_seconds


def status_lines(records: list[LedgerRecord]) -> list[str]:
    found = pruning(records, queries.night_budget(records))
    return [found.line()] if found is not None else []


def report_section(records: list[LedgerRecord]) -> list[str]:
    """report.md's "Pruning" section; nothing for a night without --prune."""
    found = pruning(records, queries.night_budget(records))
    if found is None:
        return []
    out = ["## Pruning", "", f"- {found.line()}"]
    for r in records:
        if is_pruned(r):
            out.append(f"- #{r.trial}{f'.{r.attempt}' if r.attempt > 1 else ''} pruned "
                       f"({saved_seconds(r):.0f} s saved): {' '.join(r.description.split())[:100]}")
    return out + ["", f"A trial was stopped when its smoothed train loss sat above the best's curve at the same "
                  "elapsed time (read at the machine's pace where its speed was probed beside both runs, so that "
                  "a slower machine is not held against the change; behind at the same step too where it was not) "
                  f"by more than {BAND_Z:g} x the "
                  f"curve noise, past {WARMUP_SHARE:.0%} of the budget, on {CONFIRM_LINES} progress lines in a row, "
                  f"and was not closing the gap. The rule turns itself off once {MIN_PAIRS} completed "
                  f"trials rank with a Spearman below {RHO_FLOOR} between the early gap and the final one "
                  "(docs/fidelity.md).", ""]
