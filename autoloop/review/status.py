"""``autoloop status``: where the loop stands, text or JSON (``status_data``).

Everything here only reads ``results/`` (the ledger, the state files), takes no lock and
changes nothing, so it is safe from another shell while a loop runs. The agent's cost and
the records autoloop did not write are said alike here and in the report (``report.py``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autoloop.core import epochs
from autoloop.core.layout import Layout
from autoloop.observe.console import parse_progress, plural, shorten, time_left, whole_seconds
from autoloop.review import machine_speed, prune, scout, throughput
from autoloop.review.jobs import job_data, job_lines
from autoloop.store import person_notes, queries
from autoloop.store.ledger import Ledger, LedgerRecord, trial_label
from autoloop.store.queries import tampered_attempts
from autoloop.store.state import RunState, load_state
from autoloop.store.tradeoffs import guard_lines


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    import psutil

    return bool(psutil.pid_exists(pid))


def _read_records(results_dir: Path) -> list[LedgerRecord]:
    return Ledger(results_dir).records() if Layout(results_dir).ledger.exists() else []


def status_data(results_dir: Path, now: float | None = None) -> dict[str, Any]:
    """A JSON-ready snapshot of the loop: current attempt, best, counts, pace, time left."""
    now = now or time.time()
    results_dir = Path(results_dir)
    records = _read_records(results_dir)
    state = load_state(results_dir)
    # The counts and the pace are the night's; autoloop verify's runs show in "last" and "current".
    night = queries.of_night(records)
    judged = [r for r in night if r.status != "skip"]
    baseline = queries.baseline(records)
    base = queries.baseline_estimate(records)
    best_commit, best_metric = queries.best(records)
    # The orchestrator is alive in every phase but "stopped", also between attempts ("idle").
    alive = state.phase != "stopped" and _pid_alive(state.pid)
    trials = len({r.trial for r in judged})
    hours = _hours(judged)
    fed = _device_use(records, state, baseline, now)
    return {
        "tag": state.tag,
        "running": alive,
        "phase": state.phase,
        "current": _current(state, now, alive),
        "workers": _workers(results_dir, state, now),
        "jobs": job_data(results_dir, state, records),   # executor slurm: where each job's output is
        **_look_ahead(results_dir, now),
        "best": _best(records, best_commit, best_metric),
        "noise": next((r.noise for r in reversed(records) if r.noise is not None), None),
        "machine": machine_speed.machine_data(records),   # raw and adjusted for the machine's speed
        # The baseline is the mean of its runs (the baseline's and its noise samples'), with their σ.
        "baseline": {"commit": base.commit if base else (baseline.commit if baseline else None),
                     "metric": base.metric if base else None, "sigma": base.sigma if base else None,
                     "runs": len(base.runs) if base else 0},
        "improvement": (0.0 if best_commit == base.commit else base.metric - best_metric)
                       if base and best_metric is not None else None,
        "metric_name": records[-1].metric_name if records else "val_bpb",
        "attempts": len(judged),
        "trials": trials,
        # Kept changes apart from the baseline, its noise samples and the re-runs (queries.attempt_kind).
        "status_counts": queries.attempt_counts(night),
        "crash_counts": dict(Counter(r.crash for r in night if r.crash)),
        # Proposals the duplicate gate found an earlier comparable night had measured (engine/study.py).
        "earlier_duplicates": sum(1 for r in night if r.status == "skip" and r.extra.get("earlier_night")),
        "cluster_ended": queries.cluster_ended(night),
        "trials_per_hour": round(trials / hours, 2) if hours > 0 else None,
        "device_busy": None if fed is None or fed.busy_share is None else round(fed.busy_share, 4),
        "device_span_s": None if fed is None else round(fed.span_s, 1),
        "propose_s_per_trial": None if fed is None or fed.propose_s is None else round(fed.propose_s, 2),
        "deadline": state.deadline,
        "time_left_s": round(state.deadline - now, 0) if state.deadline and alive else None,
        "stop_reason": state.stop_reason if state.phase == "stopped" else None,
        "tampered": tampered_attempts(records),
        "records_not_ours": integrity_lines(results_dir),
        **_notes_in_force(results_dir),   # what `autoloop note` tells every prompt now
        "agent_spend": spend_data(records),
        "guards": guard_lines(records),   # --guard: each guard in force and its breaches so far
        # More than one pass over the training bytes in any run of the night (core/epochs.py).
        "epochs_warning": epochs.warning(epochs.most(r.metrics for r in night)),
        "last": [{"trial": r.trial, "attempt": r.attempt, "status": r.status, "crash": r.crash,
                  "metric": r.metric, "description": r.description, "reason": r.reason,
                  "world_size": r.world_size, "tokens_per_s": r.tokens_per_s, "mfu_percent": r.mfu_percent}
                 for r in records[-5:]],
        "throughput": throughput.status_lines(records),
        "rungs": scout.status_lines(records),   # --scout: the scout and the full rung
        "pruning": prune.status_lines(records),   # --prune: the trials stopped, the time saved
    }


def _hours(judged: list[LedgerRecord]) -> float:
    """The span the ledger covers (first start to last end), in hours: the pace over it does
    not sag while a long trial runs or when status is read the next morning."""
    first_start = min((r.started_at for r in judged), default=None)
    last_end = max((r.ended_at for r in judged), default=None)
    return (last_end - first_start) / 3600 if first_start and last_end else 0.0


def _device_use(records: list[LedgerRecord], state: RunState, baseline: LedgerRecord | None,
                now: float) -> queries.Pipeline | None:
    """How well the proposer kept the device fed in this run: since its start, or since its
    baseline ended when it ran one (the baseline has no proposer to wait for)."""
    since = state.run_started_at or (records[0].started_at if records else now)
    if baseline is not None and baseline.ended_at > since:
        since = baseline.ended_at
    return queries.pipeline(records, since)


def _elapsed(started: float | None, now: float) -> float | None:
    return round(now - started, 1) if started else None


def _current(state: RunState, now: float, alive: bool) -> dict[str, Any] | None:
    """The single loop's attempt in flight."""
    if not state.in_flight:
        return None
    parsed = parse_progress(state.progress)
    return {
        "trial": state.trial, "attempt": state.attempt, "kind": state.kind, "phase": state.phase,
        "description": state.description,
        "elapsed_s": _elapsed(state.attempt_started_at, now),
        "phase_elapsed_s": _elapsed(state.phase_started_at, now),
        "progress": state.progress, "loss": parsed.get("loss"), "percent": parsed.get("percent"),
        "alive": alive,
    }


def _workers(results_dir: Path, state: RunState, now: float) -> list[dict[str, Any]]:
    """Parallel workers: each has its own attempt in flight."""
    workers = []
    for k, path in Layout(results_dir).worker_states() if state.workers else []:
        ws = load_state(results_dir, path.name)
        if ws.in_flight:
            workers.append({"worker": f"w{k}", "trial": ws.trial, "attempt": ws.attempt,
                            "kind": ws.kind, "phase": ws.phase, "description": ws.description,
                            "elapsed_s": _elapsed(ws.attempt_started_at, now)})
    return workers


def _look_ahead(results_dir: Path, now: float) -> dict[str, Any]:
    """The look-ahead proposals in flight ("ahead"), and the candidates prepared, waiting to run."""
    layout = Layout(results_dir)
    ahead = []
    for k, path in layout.ahead_states():
        st = load_state(results_dir, path.name)
        if st.in_flight:
            ahead.append({"worker": None if k is None else f"w{k}", "trial": st.trial, "phase": st.phase,
                          "elapsed_s": _elapsed(st.attempt_started_at, now)})
    prepared = sorted(int(p.stem) for p in layout.prepared_dir.glob("*.json") if p.stem.isdigit())
    return {"ahead": ahead, "prepared": prepared}


def _best(records: list[LedgerRecord], commit: str | None, metric: float | None) -> dict[str, Any]:
    record = queries.best_record(records)
    return {"commit": commit, "metric": metric,
            "trial": record.trial if record else None,
            "description": record.description if record else None,
            "confidence": record.confidence if record else None}


def spend_data(records: list[LedgerRecord]) -> dict[str, Any] | None:
    """The agent calls' reported cost and tokens; None when no agent call ran."""
    spend = queries.agent_spend(records)
    return asdict(spend) if spend.calls else None


def spend_line(spend: dict[str, Any]) -> str:
    """'$0.13 over 3 agent calls (12,000 tokens in, 963 out); 1 call reported no cost'."""
    calls = spend["calls"]
    text = (f"${spend['cost_usd']:.2f} over {calls} agent call{'s' if calls != 1 else ''} "
            f"({spend['input_tokens']:,} tokens in, {spend['output_tokens']:,} out), as the agent's CLI reported it")
    silent = spend["unreported"] + spend["without_cost"]
    if silent:
        text += (f"; {silent} call{'s' if silent != 1 else ''} reported no cost (not estimated"
                 + (", and no tokens either" if spend["unreported"] else "") + ")")
    return text


def _notes_in_force(results_dir: Path) -> dict[str, Any]:
    """The person's notes for status; a damaged notes file is said, not fatal to status."""
    try:
        return {"notes": [{"at": n.at, "text": n.text} for n in person_notes.active_notes(results_dir)]}
    except person_notes.PersonNotesError as e:
        return {"notes": [], "notes_error": str(e)}


def status_text(data: dict[str, Any]) -> str:
    return "\n".join(_doing_lines(data) + job_lines(data) + _result_lines(data) + _pipeline_lines(data)
                     + _aside_lines(data))


def _label(trial: int, attempt: int | None) -> str:
    return f"#{trial}" + (f".{attempt}" if (attempt or 1) > 1 else "")


def _elapsed_text(seconds: float | None) -> str:
    return f", {whole_seconds(seconds)} in" if seconds is not None else ""


def _doing_lines(data: dict[str, Any]) -> list[str]:
    """What the loop is doing now: the attempt in flight, each worker's, or why nothing runs."""
    if data["current"]:
        c = data["current"]
        state = "running" if c["alive"] else "interrupted (no live orchestrator: resume with autoloop run --resume)"
        lines = [f"{state}: {_label(c['trial'], c['attempt'])} {c['kind']} '{c['description'] or '-'}' "
                 f"({c['phase']}{_elapsed_text(c['elapsed_s'])})"]
        if c["progress"]:
            extra = []
            if c["percent"] is not None:
                extra.append(f"{c['percent']:.0f}% of the budget")
            if c["loss"] is not None:
                extra.append(f"loss {c['loss']:.4f}")
            lines.append(f"  {', '.join(extra) or c['progress']}")
        return lines
    if data.get("workers"):
        verb = "running" if data["running"] else "interrupted"
        lines = [f"{verb} {w['worker']}: {_label(w['trial'], w['attempt'])} {w['kind']} '{w['description'] or '-'}' "
                 f"({w['phase']}{_elapsed_text(w['elapsed_s'])})" for w in data["workers"]]
        if not data["running"]:
            lines.append("  no live orchestrator: resume with autoloop run --resume")
        return lines
    if data["stop_reason"]:
        return [f"stopped: {data['stop_reason']}"]
    if data["running"]:
        return ["running: between attempts"]
    return ["no trials yet" if not data["attempts"] else "not running"]


def _result_lines(data: dict[str, Any]) -> list[str]:
    """The best and the baseline, the counts and the pace."""
    m, lines = data["metric_name"], []
    best, base = data["best"], data["baseline"]
    if best["metric"] is not None:
        where = f" (trial {best['trial']}: {best['description']})" if best.get("trial") else ""
        conf = f", {best['confidence']:.1f}σ over its best before" if best.get("confidence") is not None else ""
        lines.append(f"best {m}: {best['metric']:.6f} at {best['commit'][:7]}{where}{conf}")
    if base["metric"] is not None:
        imp = ""
        if data["improvement"]:
            pct = 100 * data["improvement"] / base["metric"] if base["metric"] else 0.0
            imp = (f" (best is {abs(data['improvement']):.6f} {'lower' if data['improvement'] > 0 else 'higher'}, "
                   f"{abs(pct):.2f}%)")
        spread = (f", mean of {base['runs']} runs, σ {base['sigma']:.6f}" if base.get("runs", 0) > 1
                  and base.get("sigma") is not None else "")
        lines.append(f"baseline {m}: {base['metric']:.6f} at {(base['commit'] or '-')[:7]}{spread}{imp}")
    if data["attempts"]:
        counts = ", ".join(f"{COUNT_WORDS.get(k, k)} {v}" for k, v in data["status_counts"].items())
        crashes = ", ".join(f"{k} {v}" for k, v in sorted(data["crash_counts"].items()))
        lines.append(f"{data['trials']} trials, {data['attempts']} attempts: {counts}"
                     + (f" (crashes: {crashes})" if crashes else ""))
    if data.get("earlier_duplicates"):
        lines.append(f"{data['earlier_duplicates']} already measured in an earlier night on the same code: not "
                     "trained again (its result was shown to the proposer)")
    if data.get("cluster_ended"):
        lines.append(f"cluster ended {plural(data['cluster_ended'], 'job')} (preempted, node failure, lost, queue "
                     "limit): each trial submitted again, or recorded as ended past its retries; none counted "
                     "against its change")
    if data["trials_per_hour"]:
        lines.append(f"pace: {data['trials_per_hour']:.1f} trials/hour")
    return lines


# How status names the groups of queries.attempt_counts.
COUNT_WORDS = {"noise_sample": "noise samples", "confirm": "re-runs not kept"}


def _pipeline_lines(data: dict[str, Any]) -> list[str]:
    """The look-ahead, how busy the device was, the time left."""
    lines = []
    for a in data.get("ahead", []):
        who = f"{a['worker']} " if a["worker"] else ""
        lines.append(f"{who}ahead: trial {a['trial']} ({a['phase']}{_elapsed_text(a['elapsed_s'])})")
    if data.get("prepared"):
        lines.append(f"prepared, not yet run: trial {', '.join(map(str, data['prepared']))}"
                     + ("" if data["running"] else " (autoloop run --resume runs it first)"))
    if data.get("device_busy") is not None:
        proposer = data.get("propose_s_per_trial")
        lines.append(f"device busy {data['device_busy']:.0%} of {whole_seconds(data['device_span_s'])} this run"
                     + (f"; proposer {proposer:.1f} s per trial" if proposer is not None else ""))
    lines += data.get("throughput", [])
    lines += data.get("rungs", [])
    lines += data.get("pruning", [])
    if data["time_left_s"] is not None:
        lines.append(f"time left: {time_left(data['time_left_s'])}")
    return lines


def _aside_lines(data: dict[str, Any]) -> list[str]:
    """The noise, the person's notes, the agent's cost, and any tampering."""
    lines = []
    if data.get("noise") is not None:
        lines.append(f"noise: σ {data['noise']:.6f} (the noise rule needs a gain beyond z x σ)")
    lines += machine_speed.status_lines(data.get("machine"))
    if data.get("notes"):
        n = len(data["notes"])
        lines.append(f"notes: {n} in force, in every prompt (autoloop note to list them, --clear to drop them); "
                     f"latest: {shorten(data['notes'][-1]['text'])}")
    if data.get("agent_spend"):
        lines.append(f"agent cost: {spend_line(data['agent_spend'])}")
    if data.get("notes_error"):
        lines.append(f"notes: {data['notes_error']}")
    if data.get("guards"):
        lines += ["guards:", *(f"  {line[2:]}" for line in data["guards"])]
    if data.get("tampered"):
        found = data["tampered"]
        shown = "; ".join(f"#{trial_label(t['trial'], t['attempt'])} {', '.join(t['paths'][:3])}"
                          + (f" +{len(t['paths']) - 3} more" if len(t["paths"]) > 3 else "")
                          + (" (before the run)" if t["when"] == "before" else "") for t in found[-5:])
        lines.append(f"TAMPERED: {len(found)} attempt{'s' if len(found) != 1 else ''} changed a protected input "
                     f"(restored): {shown}")
    lines += [f"NOT AUTOLOOP'S: {line}" for line in data.get("records_not_ours") or ()]
    if data.get("epochs_warning"):
        lines.append(f"WARNING: {data['epochs_warning']}")
    return lines


def integrity_lines(results_dir: Path) -> list[str]:
    """Records autoloop did not write as they stand, and a results.tsv that is not the
    ledger's (store/chain.py): one line each, with its line number."""
    return Ledger(results_dir).integrity_lines() if Layout(results_dir).ledger.exists() else []


def status_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
