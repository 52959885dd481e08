"""The scheduler jobs behind the trials, for ``autoloop status``: where a job's own stdout and
stderr are (submitit's files: the job's start-up, Python's import errors, Slurm's own words
such as ``CANCELLED DUE TO TIME LIMIT``, which the trial's log in results/runs/ cannot hold),
for the trial in flight and for the last attempt whose job crashed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoloop.core.layout import Layout
from autoloop.store.ledger import LedgerRecord, trial_label
from autoloop.store.state import RunState, load_state


def _job(job: dict[str, Any] | None) -> dict[str, Any] | None:
    if not job or not job.get("job_id"):
        return None
    return {"job_id": job["job_id"], "cluster": job.get("cluster"), "stdout": job.get("job_stdout"),
            "stderr": job.get("job_stderr")}


def job_data(results_dir: Path, state: RunState, records: Sequence[LedgerRecord]) -> dict[str, Any]:
    """``running``: the job of each attempt in flight; ``last_crash``: the last crashed attempt's job."""
    states = [("", state)] + [(f"w{k} ", load_state(results_dir, path.name))
                              for k, path in (Layout(results_dir).worker_states() if state.workers else [])]
    running = []
    for who, s in states:
        job = _job(s.job) if s.in_flight else None
        if job and s.trial is not None:
            running.append({"who": f"{who}#{trial_label(s.trial, s.attempt or 1)}", **job})
    crashed = next((r for r in reversed(records) if r.status == "crash" and _job(r.extra)), None)
    last = None
    if crashed is not None:
        last = {"who": f"#{trial_label(crashed.trial, crashed.attempt)}", "reason": crashed.reason,
                **(_job(crashed.extra) or {})}
    return {"running": running, "last_crash": last}


def _where(job: dict[str, Any]) -> str:
    logs = [f"{name} {job[name]}" for name in ("stdout", "stderr") if job.get(name)]
    return "; ".join(logs) if logs else "no output files recorded"


def job_lines(data: dict[str, Any]) -> list[str]:
    jobs = data.get("jobs") or {}
    lines = [f"job {j['job_id']} ({j['cluster']}) runs {j['who']}: {_where(j)}" for j in jobs.get("running", [])]
    last = jobs.get("last_crash")
    if last:
        lines.append(f"last crashed job: {last['job_id']} ({last['who']}: {last['reason']}): {_where(last)}")
    return lines
