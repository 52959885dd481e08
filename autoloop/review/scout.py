"""Both rungs of a --scout night, for status, the report and the dashboard (store/scout.py)."""

from __future__ import annotations

from typing import Any

from autoloop.core.scout import MIN_PAIRS, RHO_FLOOR
from autoloop.store.ledger import LedgerRecord
from autoloop.store.scout import rungs


def status_lines(records: list[LedgerRecord]) -> list[str]:
    found = rungs(records)
    return found.lines() if found is not None else []


def summary(records: list[LedgerRecord]) -> dict[str, Any] | None:
    """The dashboard's view of the two rungs; None for a night that never scouted."""
    found = rungs(records)
    if found is None:
        return None
    return {"scouted": found.scouted, "promoted": found.promoted, "scouted_out": found.scouted_out,
            "samples": found.samples, "full_runs": found.full, "scout_seconds": round(found.scout_seconds, 1),
            "full_seconds": round(found.full_seconds, 1), "scout_noise": found.scout_noise,
            "rho": found.agreement.rho, "pairs": found.agreement.pairs, "on": found.off is None,
            "lines": found.lines()}


def report_section(records: list[LedgerRecord]) -> list[str]:
    """report.md's "Scout and full rungs" section; nothing for a night that never scouted."""
    found = rungs(records)
    if found is None:
        return []
    return ["## Scout and full rungs", "", *(f"- {line}" for line in found.lines()), "",
            "A proposal trained for the scout budget first; only those within z x the scout noise of the "
            "best's scout result were trained for the full budget, where every keep was decided. Scouting turns "
            f"itself off once {MIN_PAIRS} promoted candidates rank with a Spearman below {RHO_FLOOR} between the "
            "rungs (docs/fidelity.md).", ""]
