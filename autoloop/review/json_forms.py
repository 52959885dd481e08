"""The versioned JSON that `status --json`, `verify --json`, `attempts --json` and `ladder --json` print (and
the MCP server returns): each names its schema and version, and ships its JSON Schema in
``autoloop/review/schemas/`` (docs/agents.md). A field is only ever added within a version."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from autoloop.core.contributions import Estimate
from autoloop.core.layout import Layout
from autoloop.store.ledger import LedgerRecord
from autoloop.verification.verify_plan import Summary, load_plan, summarize

STATUS_SCHEMA, STATUS_VERSION = "autoloop.status", 1
VERIFY_SCHEMA, VERIFY_VERSION = "autoloop.verify", 1
SCHEMA_FILES = {"status": "status.schema.json", "attempts": "attempts.schema.json", "verify": "verify.schema.json",
                "ladder": "ladder.schema.json", "history": "history.schema.json", "event": "event.schema.json"}


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one command's output (``status``, ``attempts``, ``verify``)."""
    text = resources.files("autoloop.review").joinpath("schemas", SCHEMA_FILES[name]).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def status_payload(data: dict[str, Any]) -> dict[str, Any]:
    """status_data's snapshot with its schema's name and version first."""
    return {"schema": STATUS_SCHEMA, "version": STATUS_VERSION, **data}


def _estimate(e: Estimate | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"mean": e.mean, "half_width": e.half, "low": e.low, "high": e.high, "pairs": e.n, "verdict": e.verdict}


def verify_payload(summary: Summary | None) -> dict[str, Any]:
    """A verification's verdict so far (None: there has been none)."""
    base = {"schema": VERIFY_SCHEMA, "version": VERIFY_VERSION}
    if summary is None:
        return {**base, "plan": None, "changes": [], "left": 0}
    p = summary.plan
    return {**base,
            "plan": {"tag": p.tag, "best": p.best, "baseline": p.baseline, "direction": p.direction,
                     "repeats": p.repeats, "seeds": p.seeds, "scale": p.scale, "scale_budget": p.scale_budget,
                     "transfer_planned": p.transfer_planned},
            "gain": _estimate(summary.gain), "gain_at_scale": _estimate(summary.gain_at_scale),
            "changes": [{"trials": list(c.trials), "description": c.description, "revert": c.revert,
                         "contribution": _estimate(c.estimate), "at_scale": _estimate(c.at_scale), "holds": c.holds}
                        for c in summary.changes],
            "crashed": summary.crashed, "left": summary.left}


def verify_status(layout: Layout, records: list[LedgerRecord]) -> dict[str, Any]:
    """The verification in results/verify/, judged on the ledger as it stands (reads only)."""
    plan = load_plan(layout)
    return verify_payload(None if plan is None else summarize(plan, records))
