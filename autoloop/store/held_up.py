"""Whether a night's kept changes held up: what `autoloop verify` and `autoloop ladder` said
of each, read from that night's own files, for the memory of later nights (store/digest.py).

* **verify**: the runs of kind ``verify`` of the night's final best (their ``best`` is it;
  an earlier verification of another best is not this best's), the best against the best
  without each change, paired by repeat (``core.contributions.paired``, as verify's summary):
  ``verify confirmed +0.0123``, ``verify within noise``, ``verify harmful``; at the night's
  scale only (the transfer's runs are the verification's business).
* **ladder**: ``results/ladder/verdicts.json``'s verdict for the change (HOLDS, SHRINKING,
  SCALE-BOUND, NOISE, NOT-PREDICTIVE, RETUNE-AT-SCALE), when of this night's tag.

Read without the verification layer (above this one): the records carry every fact needed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from autoloop.core.contributions import paired
from autoloop.core.layout import LADDER
from autoloop.store import queries
from autoloop.store.ledger import LedgerRecord


def held_up(records: Sequence[LedgerRecord], folder: Path, tag: str, direction: str) -> dict[int, str]:
    """Kept change's trial -> what verify and the ladder said of it ("" parts left out)."""
    said: dict[int, list[str]] = {}
    best = queries.best(list(records))[0]
    runs: dict[tuple[str, tuple[int, ...]], dict[int, float]] = {}
    for r in records:
        info = r.extra.get("verify") if isinstance(r.extra, dict) else None
        if (r.kind != "verify" or not isinstance(info, dict) or info.get("scaled") or r.best != best
                or r.metric is None or r.status == "crash" or queries.was_interrupted(r)):
            continue
        repeat, changes = info.get("repeat"), info.get("changes") or []
        if isinstance(repeat, int) and isinstance(changes, list):
            runs.setdefault((str(info.get("role")), tuple(changes)), {})[repeat] = r.metric
    best_runs = runs.get(("best", ()), {})
    for (role, changes), without in runs.items():
        if role != "without" or not best_runs:
            continue
        est = paired(without, best_runs, direction)
        text = f"verify {est.verdict}" + (f" {est.mean:+.4g}" if est.verdict == "confirmed" else "")
        for trial in changes:
            said.setdefault(trial, []).append(text)
    path = folder / LADDER / "verdicts.json"
    try:
        verdicts = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        verdicts = {}   # a damaged file says nothing; the night's memory goes on without it
    for trial, v in (verdicts.items() if isinstance(verdicts, dict) else ()):
        if isinstance(v, dict) and v.get("tag") == tag and isinstance(v.get("verdict"), str) and trial.isdigit():
            said.setdefault(int(trial), []).append(f"ladder {v['verdict']}")
    return {t: "; ".join(parts) for t, parts in said.items()}
