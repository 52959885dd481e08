"""Taking the result of a trial whose job ran on while its orchestrator was dead.

With ``--executor slurm`` the trial is a job (or a step of the night's allocation): a
``kill -9`` of the orchestrator leaves it running. ``autoloop run --resume`` re-attaches to a
job still queued or running (:func:`reattach`: it waits for it, bounded by the trial's hard
timeout) rather than cancel work the cluster is doing for the night; a Ctrl-C during that
wait cancels it, as before. The outcome of the ended job is then recorded as
the attempt's, instead of ``interrupted``, when it can be trusted
(:func:`autoloop.execution.executors.collect_finished_job`: the job's own result, the
result's nonce the one recorded at submission) and the inputs were not changed meanwhile;
decided like any run, without a confirmation re-run (the loop that would run it is gone).
"""

from __future__ import annotations

import time
from typing import cast

from autoloop.core.classify import classify
from autoloop.core.keep import Facts, decide
from autoloop.engine.night import Night
from autoloop.execution.executors import collect_finished_job, wait_for_job
from autoloop.execution.integrity import Tampering
from autoloop.store.ledger import AttemptKind, Draft, Extra
from autoloop.store.state import RunState

# Kinds whose decision rests on this run alone (a confirmation's also on earlier runs).
COLLECTABLE = ("baseline", "candidate", "fix")
# Waiting past the trial's hard timeout (and the queue's limit): the job's start-up and the
# node's tree kill, as the scheduler's own limit allows (slurm.TIME_MARGIN_S).
REATTACH_GRACE_S = 300.0


def collectable(state: RunState) -> bool:
    """Whether the attempt's job, once ended, could give the attempt's result (record_finished_job)."""
    return (state.phase == "running" and bool(state.candidate) and bool(state.job)
            and (state.kind or "candidate") in COLLECTABLE)


def reattach(night: Night, state: RunState) -> bool:
    """Wait for the interrupted attempt's job while its engine says it is queued or running,
    saying so; True once it has ended (its result is then taken or not, as for a job that
    finished meanwhile), False when the caller must cancel it: not collectable, Ctrl-C (the
    night's stop) during the wait, or still running past the trial's hard timeout."""
    if not collectable(state):
        return False
    s = night.settings
    limit = max(s.timeout_s, s.slurm_time_limit or 0) + (s.slurm_pending_timeout or 0) + REATTACH_GRACE_S
    until = (state.attempt_started_at or time.time()) + limit
    which = f"trial {state.trial}.{state.attempt}"
    heard: list[str] = []

    def on_progress(line: str) -> None:
        if not heard:
            clock = time.strftime("%H:%M", time.localtime(until))
            night.console.line(f"recovery: {which}: re-attached to {line}; waiting for it to end "
                               f"(at most until {clock}; Ctrl-C cancels it)")
        else:
            night.console.line(f"recovery: {which}: {line}")
        heard.append(line)

    ended = wait_for_job(state.job, until, night.stop.event, on_progress)
    if not ended and heard and not night.stop.is_set():
        night.console.line(f"recovery: {which}: its job still runs past the trial's hard timeout")
    return ended


def record_finished_job(night: Night, state: RunState, tampered: Tampering, worker: int | None) -> str | None:
    """Record the finished job's outcome as the attempt's; the best after the record, or
    None when there is nothing trustworthy to take (the caller records it interrupted)."""
    kind = state.kind or "candidate"
    if tampered or not collectable(state):
        return None
    outcome = collect_finished_job(state.job)
    if outcome is None or outcome.metric is None or classify(outcome).kind != "ok":
        return None
    theirs = (outcome.result or {}).get("fingerprint")
    if theirs and night.fingerprint and theirs != night.fingerprint:
        return None
    decision = decide(Facts(kind=kind, commit=state.candidate, runs=(outcome.metric,),
                            parent=(state.best, state.best_metric), current=night.arbiter.best(),
                            noise=night.arbiter.noise(), can_confirm=False))
    if decision.action not in ("keep", "discard"):
        return None   # a replay onto a best that moved meanwhile needs the loop: interrupted
    summary = outcome.summary or {}
    # Recovery asked for the attempt's trial before it came here (recovery._attempt_of).
    assert state.trial is not None, "an attempt in flight without its trial"
    record = night.arbiter.record(Draft(
        trial=state.trial, attempt=state.attempt or 1, kind=cast(AttemptKind, kind),
        started_at=state.attempt_started_at or outcome.started_at, ended_at=time.time(),
        proposer=state.proposer or "-", parent=state.best, commit=state.candidate,
        description=state.description or "-", metric_name=night.settings.metric, metric=outcome.metric,
        memory_gb=(summary.get("peak_vram_mb") or outcome.peak_rss_mb or 0) / 1024,
        training_seconds=summary.get("training_seconds"), total_seconds=summary.get("total_seconds"),
        wall_seconds=outcome.wall_seconds, exit_code=outcome.exit_code, seed=night.settings.seed,
        fingerprint=theirs or night.fingerprint,
        log_path=night.layout.log_rel(state.trial or 0, state.attempt or 1),
        extra=cast(Extra, dict(outcome.job)),   # executor slurm: executor, cluster, job_id
    ), decision, worker)
    night.console.line(f"recovery: trial {state.trial}.{state.attempt}: its job {outcome.job.get('job_id')} "
                       f"finished meanwhile; its result taken ({record.status}, {night.settings.metric} "
                       f"{outcome.metric:.6f})")
    return record.best
