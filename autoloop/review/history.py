"""`autoloop history`, the report's and the dashboard's page of the study: every night of the
workspace (store/study.py), oldest first, with its best, its gain over its baseline, its
kept changes, its verify runs and device-hours, and the running best of the study across
nights.

The reference night is the newest one: a night whose budget, corpus, metric or machine
differs from it is marked not comparable, with the reasons, and its numbers are left out of
the running best (``running_best`` is null for it) so that nothing measured differently is
mixed in. The JSON form is versioned (``autoloop/review/schemas/history.schema.json``), as
``attempts --json`` is; tags and reasons come from the person's flags and the records.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from autoloop.core.layout import branch_name
from autoloop.store.study import StudyNight, differences, read_study

SCHEMA = "autoloop.history"
VERSION = 1


def history_payload(results_dir: Path, branches: set[str] | None = None) -> dict[str, Any]:
    """Every night of the study as JSON-ready rows; ``branches``: the repository's branch
    names (a night's final branch is said to exist or not), None when unknown."""
    unreadable: list[str] = []
    nights = read_study(Path(results_dir), unreadable=unreadable)
    reference = nights[-1] if nights else None
    direction = (reference.info.direction or "min") if reference is not None else "min"
    rows, running = [], None
    for night in nights:
        why = differences(night, reference) if reference is not None else []
        _, best = night.best
        if not why and best is not None:
            better = running is None or (best < running if direction == "min" else best > running)
            running = best if better else running
        rows.append(_row(night, why, running if not why else None, branches))
    return {"schema": SCHEMA, "version": VERSION, "reference": reference.tag if reference else None,
            "direction": direction, "metric": reference.info.metric if reference else None,
            "study_best": running, "nights": rows, "unreadable": unreadable}


def _row(n: StudyNight, why: list[str], running: float | None, branches: set[str] | None) -> dict[str, Any]:
    best_commit, best = n.best
    info = n.info
    return {"tag": n.tag, "live": n.live, "started_at": n.started_at, "ended_at": n.ended_at,
            "attempts": len(n.night_records), "baseline": n.baseline, "best": best, "best_commit": best_commit,
            "gain": n.gain, "kept": len(n.kept), "verify_runs": n.verify_runs,
            "device_hours": round(n.device_hours, 4), "budget_s": info.budget_s, "metric": info.metric,
            "direction": info.direction, "fingerprint": info.fingerprint, "gpu": info.gpu,
            "world_size": info.world_size, "from_tag": info.from_tag, "start_commit": n.baseline_commit,
            "branch": branch_name(n.tag),
            "branch_exists": None if branches is None else branch_name(n.tag) in branches,
            "comparable": not why, "not_comparable": why, "running_best": running}


def to_json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, indent=1, allow_nan=False, default=str)


def to_text(payload: dict[str, Any]) -> str:
    nights = payload["nights"]
    left_out = [f"left out, its ledger unreadable: {line}" for line in payload["unreadable"]]
    if not nights:
        return "\n".join(["no nights yet: results/ has no ledger (start one with autoloop run)", *left_out])
    lines = [f"{len(nights)} night(s); numbers compared with the newest, {payload['reference']} "
             f"({payload['metric']}, {'lower' if payload['direction'] == 'min' else 'higher'} is better)",
             f"{'tag':<16} {'started':<16} {'tries':>5} {'baseline':>10} {'best':>10} {'gain':>9} {'kept':>4} "
             f"{'dev-h':>6} {'study best':>10}  machine"]
    for r in nights:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started_at"])) if r["started_at"] else "-"
        machine = f"{r['gpu'] or '?'} x{r['world_size'] or '?'}, budget {_num(r['budget_s'], 'g')}s"
        lines.append(f"{r['tag'][:16]:<16} {started:<16} {r['attempts']:>5} {_num(r['baseline']):>10} "
                     f"{_num(r['best']):>10} {_num(r['gain'], '+.4f'):>9} {r['kept']:>4} "
                     f"{r['device_hours']:>6.2f} {_num(r['running_best']):>10}  {machine}")
        if r["not_comparable"]:
            lines.append(f"{'':<16} not comparable: {'; '.join(r['not_comparable'])}")
    return "\n".join(lines + left_out)


def history_section(payload: dict[str, Any], picture: str | None = None) -> list[str]:
    """The report's page of the study (markdown); nothing for a study of one night."""
    nights = payload["nights"]
    if len(nights) < 2:
        return []
    out = ["## The study across nights", "",
           f"Every night of this workspace; the running best counts only the nights comparable with "
           f"{payload['reference']} (same budget, corpus, metric and machine).", ""]
    if picture:
        out += [f"![the running best across nights]({picture})", ""]
    out += ["| night | started | attempts | baseline | best | gain | kept | device-h | study best | comparable |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in nights:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started_at"])) if r["started_at"] else "-"
        comparable = "yes" if r["comparable"] else "no: " + "; ".join(r["not_comparable"])
        out.append(f"| {r['tag']} | {started} | {r['attempts']} | {_num(r['baseline'])} | {_num(r['best'])} | "
                   f"{_num(r['gain'], '+.4f')} | {r['kept']} | {r['device_hours']:.2f} | "
                   f"{_num(r['running_best'])} | {comparable} |")
    return out + [""]


def _num(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)
