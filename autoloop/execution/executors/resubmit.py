"""Submitting a trial again when its cluster, not its code, ended it: shared by the engines.

A job preempted, lost by the scheduler, or whose node died says nothing of the change it
ran: the trial is submitted again, ``retries`` times, after a wait that doubles from
``backoff`` up to BACKOFF_MAX_S (a preempting job or a failed node is seldom gone at once);
one more such end is still the cluster's (``RunOutcome.cluster_ended``), never the change's
crash. Each end is listed in the outcome's ``job["resubmitted"]``, which the ledger counts
apart (store.queries.cluster_ended), never against the change.

Which ends count: the engine puts the cluster's word for it first in ``job["job_state"]``
(``NODE_FAIL (...)``), and :data:`RESUBMIT` says what it means.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from autoloop.core.durations import format_duration
from autoloop.execution.runner import RunOutcome

BACKOFF_S = 30.0
BACKOFF_MAX_S = 300.0
# Ends that say nothing of the candidate: the trial is submitted again, not blamed.
RESUBMIT = {"PREEMPTED": "was preempted", "NODE_FAIL": "lost its node (NODE_FAIL)",
            "LOST": "was lost: the cluster no longer knows it",
            "PENDING_LIMIT": "waited in the queue past slurm_pending_timeout",
            "NODE_DIED": "lost its node (Ray: the node died)"}


def backoff_s(attempt: int, base: float = BACKOFF_S) -> float:
    """The wait before the ``attempt``-th resubmission (1, 2, ...): base, doubled each time, capped."""
    return min(BACKOFF_MAX_S, base * 2 ** (attempt - 1)) if base > 0 else 0.0


def cluster_end(outcome: RunOutcome) -> str | None:
    """What the cluster did to the trial's job when that says nothing of the trial, else None."""
    return RESUBMIT.get(str(outcome.job.get("job_state", "")).split(" ")[0])


def with_resubmission(run_once: Callable[[], RunOutcome], log_path: Path, stop_event: threading.Event | None,
                      retries: int, backoff: float) -> RunOutcome:
    """``run_once()`` until it ends other than by the cluster, ``retries`` resubmissions at most."""
    resubmitted: list[str] = []
    while True:
        outcome = run_once()
        stopped = stop_event is not None and stop_event.is_set()
        why = cluster_end(outcome)
        if why is not None and not stopped and len(resubmitted) >= retries:
            # Past the retries the end is still the cluster's: an end of its own, never the change's crash.
            tries = f" (submitted {len(resubmitted) + 1} times)" if resubmitted else ""
            outcome = outcome.model_copy(update={"cluster_ended": f"job {outcome.job['job_id']} {why}{tries}"})
        if why is None or stopped or len(resubmitted) >= retries:
            break
        job_id = str(outcome.job.get("job_id"))
        resubmitted.append(f"job {job_id}: {outcome.job['job_state']}")
        wait = backoff_s(len(resubmitted), backoff)
        set_aside_log(log_path, job_id, why, wait)
        if stop_event is not None and stop_event.wait(wait):
            break   # stopped while waiting: the outcome says how the last job ended
        if stop_event is None:
            time.sleep(wait)
    if resubmitted:
        outcome = outcome.model_copy(update={"job": {**outcome.job, "resubmitted": resubmitted}})
    return outcome


def set_aside_log(log_path: Path, job_id: str, why: str, wait: float = 0.0) -> None:
    """The ended job's log, kept beside the one its resubmission writes (which must not
    exist before the new job starts: its absence is how a pending job is told apart)."""
    with contextlib.suppress(OSError):
        with open(log_path, "a") as f:
            after = f" in {format_duration(wait)}" if wait > 0 else ""
            f.write(f"[autoloop] job {job_id} {why}; the trial is submitted again{after}\n")
        log_path.replace(log_path.with_name(f"{log_path.stem}.job-{job_id}{log_path.suffix}"))
