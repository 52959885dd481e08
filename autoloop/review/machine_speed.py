"""The machine's speed beside the metric, for status, the report and the dashboard.

Raw and adjusted side by side: the raw metric is what the runs measured; the adjusted one
is the same at the night's median machine speed (store/machine_speed.py), shown only where the
night's fit is used for decisions; otherwise the fit's one line says why not.
"""

from __future__ import annotations

from typing import Any

from autoloop.store import machine_speed, queries
from autoloop.store.ledger import LedgerRecord, trial_label
from autoloop.verification.verify_plan import Summary, variant_label

MAX_ROWS = 40   # the report's table keeps the latest runs


def machine_data(records: list[LedgerRecord]) -> dict[str, Any] | None:
    """status's and the dashboard's ``machine``: the fit and the best raw and adjusted; None
    when no run was probed."""
    if not any(r.machine_speed is not None for r in records):
        return None
    f, adjusted = machine_speed.adjusted_metrics(records)
    best_commit, best_metric = queries.best(records)
    best_adj = [adjusted[(r.trial, r.attempt)] for r in records
                if r.commit == best_commit and (r.trial, r.attempt) in adjusted and r.kind != "verify"]
    return {"use": f.use, "note": f.note, "slope": f.slope, "reference": f.reference,
            "raw_spread": f.raw_spread, "adjusted_spread": f.adjusted_spread,
            "best_raw": best_metric, "best_adjusted": sum(best_adj) / len(best_adj) if best_adj else None,
            "adjusted": {trial_label(t, a): v for (t, a), v in adjusted.items()}}


def status_lines(data: dict[str, Any] | None) -> list[str]:
    if not data:
        return []
    line = f"machine speed: {data['note']}"
    if data["use"] and data["best_adjusted"] is not None and data["best_raw"] is not None:
        line += f"; best {data['best_raw']:.6f} raw, {data['best_adjusted']:.6f} adjusted"
    return [line]


def report_section(records: list[LedgerRecord], metric: str) -> list[str]:
    """report.md's "Machine speed": the fit, and the probed runs raw and adjusted."""
    data = machine_data(records)
    if data is None:
        return []
    out = ["## Machine speed", "",
           f"A fixed reference probe measured the machine's speed beside each run (docs/machine-speed.md). "
           f"Over the night's repeats of one commit: {data['note']}.", ""]
    probed = [r for r in records if r.machine_speed is not None and r.metric is not None
              and r.status in ("keep", "discard")][-MAX_ROWS:]
    ref = data["reference"] or 1.0
    out += [f"| trial | kind | commit | speed (x median) | {metric} raw | adjusted |", "|---|---|---|---|---|---|"]
    for r in probed:
        adj = data["adjusted"].get(trial_label(r.trial, r.attempt))
        out.append(f"| {trial_label(r.trial, r.attempt)} | {r.kind} | {(r.commit or '-')[:7]} | "
                   f"{(r.machine_speed or 0) / ref:.2f} | {r.metric:.6f} | {'-' if adj is None else f'{adj:.6f}'} |")
    return out + [""]


def verification_lines(summary: Summary) -> list[str]:
    """Under the verification's table: the same contributions at the median machine speed
    (the verdicts read these where the night's fit is used), or why there are none."""
    if summary.machine is None:
        return []
    out = ["", f"Machine speed: {summary.machine}."]
    if summary.gain_adjusted is None:
        return out
    rows = [("the best vs the baseline", summary.gain_adjusted)]
    rows += [(f"{variant_label(list(c.trials))}", c.adjusted) for c in summary.changes if c.adjusted is not None]
    return out + ["At the median machine speed (what the verdicts read): "
                  + "; ".join(f"{who} {e.text()}, {e.verdict}" for who, e in rows) + "."]
