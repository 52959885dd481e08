"""Reading a workspace's results for people: `autoloop status` (text or JSON).

Everything here only reads ``results/`` (the ledger and the state file), takes no lock
and changes nothing, so it is safe from another shell while a loop runs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from autoloop.config import format_duration
from autoloop.ledger import Ledger
from autoloop.state import load_state


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    import psutil

    return psutil.pid_exists(pid)


def status_data(results_dir: Path, now: float | None = None) -> dict:
    """A JSON-ready snapshot of the loop: current attempt, best, counts, pace, time left."""
    now = now or time.time()
    results_dir = Path(results_dir)
    records = Ledger(results_dir).records() if (results_dir / "ledger.jsonl").exists() else []
    state = load_state(results_dir)
    judged = [r for r in records if r.status != "skip"]
    baseline = next((r for r in records if r.kind == "baseline" and r.status == "keep"), None)
    best_commit, best_metric = None, None
    for r in reversed(records):
        if r.best is not None:
            best_commit, best_metric = r.best, r.best_metric
            break
    running = state.in_flight and _pid_alive(state.pid)
    first_start = min((r.started_at for r in judged), default=None)
    hours = (now - first_start) / 3600 if first_start else 0.0
    current = None
    if state.in_flight:
        current = {
            "trial": state.trial, "attempt": state.attempt, "kind": state.kind, "phase": state.phase,
            "description": state.description,
            "elapsed_s": round(now - state.attempt_started_at, 1) if state.attempt_started_at else None,
            "progress": state.progress, "alive": running,
        }
    improvement = None
    if baseline and baseline.metric is not None and best_metric is not None:
        improvement = baseline.metric - best_metric
    return {
        "tag": state.tag,
        "running": running,
        "current": current,
        "best": {"commit": best_commit, "metric": best_metric},
        "baseline": {"commit": baseline.commit if baseline else None, "metric": baseline.metric if baseline else None},
        "improvement": improvement,
        "metric_name": records[-1].metric_name if records else "val_bpb",
        "attempts": len(judged),
        "trials": len({r.trial for r in judged}),
        "status_counts": dict(Counter(r.status for r in records)),
        "crash_counts": dict(Counter(r.crash for r in records if r.crash)),
        "trials_per_hour": round(len({r.trial for r in judged}) / hours, 2) if hours > 0 else None,
        "time_left_s": round(state.deadline - now, 0) if state.deadline and running else None,
        "stop_reason": state.stop_reason if state.phase == "stopped" else None,
        "last": [{"trial": r.trial, "attempt": r.attempt, "status": r.status, "crash": r.crash,
                  "metric": r.metric, "description": r.description, "reason": r.reason} for r in records[-5:]],
    }


def status_text(data: dict) -> str:
    m = data["metric_name"]
    lines = []
    if data["current"]:
        c = data["current"]
        label = f"#{c['trial']}" + (f".{c['attempt']}" if (c["attempt"] or 1) > 1 else "")
        elapsed = f", {format_duration(c['elapsed_s'])} in" if c["elapsed_s"] else ""
        state = "running" if c["alive"] else "interrupted (no live orchestrator: resume with autoloop run --resume)"
        lines.append(f"{state}: {label} {c['kind']} '{c['description'] or '-'}' ({c['phase']}{elapsed})")
        if c["progress"]:
            lines.append(f"  {c['progress']}")
    elif data["stop_reason"]:
        lines.append(f"stopped: {data['stop_reason']}")
    elif not data["attempts"]:
        lines.append("no trials yet")
    best, base = data["best"], data["baseline"]
    if best["metric"] is not None:
        lines.append(f"best {m}: {best['metric']:.6f} at {best['commit'][:7]}")
    if base["metric"] is not None:
        imp = f" (improved by {data['improvement']:.6f})" if data["improvement"] else ""
        lines.append(f"baseline {m}: {base['metric']:.6f}{imp}")
    if data["attempts"]:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(data["status_counts"].items()))
        crashes = ", ".join(f"{k} {v}" for k, v in sorted(data["crash_counts"].items()))
        lines.append(f"{data['trials']} trials, {data['attempts']} attempts: {counts}" + (f" (crashes: {crashes})" if crashes else ""))
    if data["trials_per_hour"]:
        lines.append(f"pace: {data['trials_per_hour']:.1f} trials/hour")
    if data["time_left_s"] is not None:
        lines.append(f"time left: {format_duration(max(0, data['time_left_s']))}")
    return "\n".join(lines)


def status_json(data: dict) -> str:
    return json.dumps(data, indent=2)
