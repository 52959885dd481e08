"""The night's machine-speed fit, asked of a ledger (core/machine_speed.py does the statistics).

Every judged run of the night that has a ``machine_speed`` is a point; runs of one commit
(noise samples, confirmations, verification runs) are the repeats the slope is fitted on.
"""

from __future__ import annotations

from autoloop.core.machine_speed import Adjusted, Run, SpeedFit, adjusted_inputs, fit
from autoloop.store.ledger import LedgerRecord


def _judged(r: LedgerRecord) -> bool:
    # A scout run (--scout) trained for another budget: its metric is on another scale.
    return r.metric is not None and r.status in ("keep", "discard") and bool(r.commit) and r.fidelity == "full"


def runs(records: list[LedgerRecord]) -> list[Run]:
    """The points of the fit: every judged run with a commit, its metric and speed."""
    return [Run(r.commit or "", r.metric, r.machine_speed) for r in records if _judged(r) and r.metric is not None]


def night_fit(records: list[LedgerRecord], *more: Run) -> SpeedFit:
    """The fit over the ledger's runs (and ``more``: a run not yet recorded)."""
    return fit([*runs(records), *more])


def runs_of(records: list[LedgerRecord], commit: str) -> list[tuple[float, float | None]]:
    """(metric, speed) of the judged runs of one commit, as queries.runs_of counts them."""
    return [(r.metric, r.machine_speed) for r in records
            if r.commit == commit and _judged(r) and r.kind != "verify" and r.metric is not None]


def for_decision(records: list[LedgerRecord], commit: str, metrics: tuple[float, ...], speed: float | None,
                 best: str | None, noise: float | None) -> Adjusted | None:
    """The keep decision's adjusted inputs for a run of ``commit`` just measured (its metric
    last in ``metrics``, the earlier ones its recorded runs) against the best ``best``."""
    if not metrics or speed is None or best is None:
        return None
    f = night_fit(records, Run(commit, metrics[-1], speed))
    if not f.use:
        return None
    earlier = runs_of(records, commit)[-(len(metrics) - 1):] if len(metrics) > 1 else []
    if len(earlier) != len(metrics) - 1:
        return None
    return adjusted_inputs(f, [*earlier, (metrics[-1], speed)], runs_of(records, best), noise)


def adjusted_metrics(records: list[LedgerRecord]) -> tuple[SpeedFit, dict[tuple[int, int], float]]:
    """The night's fit now and every judged run's metric at its reference speed (by trial,
    attempt), for status, the report and the dashboard; empty when the fit is not used."""
    f = night_fit(records)
    if not f.use:
        return f, {}
    return f, {(r.trial, r.attempt): f.adjust(r.metric, r.machine_speed)
               for r in records if _judged(r) and r.metric is not None and r.machine_speed is not None}
