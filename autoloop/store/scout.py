"""Questions asked of a ledger about the scout rung (--scout; core/scout.py's rules).

Pure functions of the records, like queries.py: the best's scout runs (the reference a
scout result is judged against), the rung's noise, the (scout, full) pairs of the promoted
candidates, and a summary of both rungs for status, the report and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoloop.core.scout import Agreement, ScoutRef, agreement, pooled_sigma, switched_off
from autoloop.store.ledger import LedgerRecord


def is_scout(record: LedgerRecord) -> bool:
    return record.kind == "scout"


def _measured(record: LedgerRecord) -> bool:
    """A scout sample of a best with its result. The scout run that promoted a change is not
    one: it was chosen for being good, and as the new best's reference it would set the bar
    as high as its luck (each keep gets fresh samples instead, scouting.after_keep)."""
    return (is_scout(record) and record.metric is not None and record.status == "discard"
            and bool(record.extra.get("scout_sample")))


def scout_runs(records: list[LedgerRecord], commit: str | None) -> list[float]:
    """The scout samples of one commit: the reference its candidates' scout results meet."""
    return [r.metric for r in records if r.commit == commit and _measured(r) and r.metric is not None]


def scout_noise(records: list[LedgerRecord]) -> float | None:
    """The scout rung's noise: pooled over the samples of every best sampled more than once."""
    groups: dict[str, list[float]] = {}
    for r in records:
        if _measured(r) and r.commit and r.metric is not None:
            groups.setdefault(r.commit, []).append(r.metric)
    return pooled_sigma(list(groups.values()))


def scout_ref(records: list[LedgerRecord], best: str | None) -> ScoutRef:
    return ScoutRef(tuple(scout_runs(records, best)), scout_noise(records))


def promoted(record: LedgerRecord) -> bool:
    return is_scout(record) and bool((record.extra.get("scout") or {}).get("promoted"))


def scouted_out(record: LedgerRecord) -> bool:
    return is_scout(record) and (record.extra.get("scout") or {}).get("promoted") is False


def scout_pairs(records: list[LedgerRecord]) -> list[tuple[float, float]]:
    """(scout result, full result) of each promoted candidate whose full run has a metric,
    in the order the full runs were recorded."""
    waiting: dict[tuple[int, str | None], float] = {}
    pairs: list[tuple[float, float]] = []
    for r in records:
        if promoted(r) and r.metric is not None:
            waiting[(r.trial, r.commit)] = r.metric
        elif (r.fidelity == "full" and r.kind in ("candidate", "fix") and r.metric is not None
              and (r.trial, r.commit) in waiting):
            pairs.append((waiting.pop((r.trial, r.commit)), r.metric))
    return pairs


@dataclass(frozen=True)
class Rungs:
    """Both rungs of a night, as status, the report and the dashboard show them."""

    scouted: int                  # candidates run at the scout budget
    promoted: int                 # of them sent on to the full budget
    scouted_out: int
    samples: int                  # scout runs of the best (its reference, the rung's noise)
    full: int                     # runs at the full budget (every kind)
    scout_seconds: float          # wall seconds spent at each rung
    full_seconds: float
    scout_noise: float | None
    agreement: Agreement
    off: Agreement | None         # the agreement that switched scouting off; None: still on

    def lines(self) -> list[str]:
        noise = "-" if self.scout_noise is None else f"{self.scout_noise:.6f}"
        state = (f"switched off ({self.off.line()} < floor)" if self.off is not None else "on")
        return [f"scout rung: {self.scouted} scouted, {self.promoted} promoted, {self.scouted_out} scouted out, "
                f"{self.samples} runs of the best; noise {noise}; {self.scout_seconds / 60:.1f} min",
                f"full rung: {self.full} runs, {self.full_seconds / 60:.1f} min; {self.agreement.line()}; "
                f"scouting {state}"]


def rungs(records: list[LedgerRecord]) -> Rungs | None:
    """None for a night that never scouted."""
    scouts = [r for r in records if is_scout(r)]
    if not scouts:
        return None
    ran = [r for r in records if r.status != "skip" and r.kind != "verify"]
    candidates = [r for r in scouts if "scout" in r.extra]
    pairs = scout_pairs(records)
    return Rungs(
        scouted=len(candidates), promoted=sum(promoted(r) for r in candidates),
        scouted_out=sum(scouted_out(r) for r in candidates),
        samples=sum(1 for r in scouts if r.extra.get("scout_sample")),
        full=sum(1 for r in ran if r.fidelity == "full"),
        scout_seconds=sum(r.wall_seconds for r in scouts),
        full_seconds=sum(r.wall_seconds for r in ran if r.fidelity == "full"),
        scout_noise=scout_noise(records), agreement=agreement(pairs), off=switched_off(pairs))


def full_rung_view(records: list[LedgerRecord]) -> list[LedgerRecord]:
    """The records as the research digest shows them to a proposer: a promoted scout run is
    left out (its full run tells the idea), so is a scout run of the best; a scouted-out
    one stays, its description saying so and without its number (a scout result is not
    comparable with the full-budget best)."""
    out = []
    for r in records:
        if not is_scout(r):
            out.append(r)
        elif scouted_out(r):
            out.append(r.model_copy(update={"metric": None, "description": f"[scouted out] {r.description}"}))
    return out
