"""Where a trial runs: ``local`` (the runner, in this process), ``slurm`` (a job, via submitit)
or ``ray`` (an actor on a Ray cluster, executors/ray_executor.py).

Every executor has the runner's contract: ``run(spec, on_progress, stop_event, on_start,
on_job) -> RunOutcome`` returns only when the trial is over, with the same timeout, log,
result-file and classification semantics. ``on_job`` gets a small dict naming the job
(executor, cluster, job id, ...) as soon as it is submitted, so that the orchestrator can
record it in state.json for recovery: after a kill -9 of the orchestrator, ``--resume``
waits for a job still queued or running (:func:`wait_for_job`), takes its result when it can
be trusted (:func:`collect_finished_job`), and cancels it only when it cannot wait
(:func:`cancel_job`: Ctrl-C during the wait, or past the trial's hard timeout).

``places_devices``: whether the executor's engine places the trial and binds its devices
there (Slurm's GRES binding on the node sets CUDA_VISIBLE_DEVICES for the job; Ray sets it for
the trial's actor). The
orchestrator then computes and ships no device variables of its own (devices.placed_envs):
what it sees on its own host (a login node without GPUs) says nothing of the trial's node,
and the slot's variables would override the engine's binding in the trial's environment.

The local executor never imports submitit or ray: they are optional dependencies (extras
``slurm`` and ``ray``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autoloop.core.errors import AutoloopError
from autoloop.execution.runner import RunOutcome, RunSpec, run_process

if TYPE_CHECKING:
    from autoloop.config.settings import Settings

OnProgress = Callable[[str], None]
OnStart = Callable[[list[tuple[int, float]]], None]
OnJob = Callable[[dict[str, Any]], None]


class ExecutorError(AutoloopError):
    """The executor cannot be set up; the message is one line for the user."""


class Executor(Protocol):
    name: str
    plan: str | None   # what each trial asks of where it runs, and why: said once at the start
    places_devices: bool   # the engine binds each trial's devices where it places it (see above)

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome: ...


class LocalExecutor:
    """The trial runs here, as a child process of the orchestrator (autoloop.execution.runner)."""

    name = "local"
    plan: str | None = None
    places_devices = False   # the trial runs here: the slots' devices (devices.slot_envs) are its own

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome:
        return run_process(spec, on_progress=on_progress, stop_event=stop_event, on_start=on_start)


def make_executor(settings: Settings, root: Path) -> Executor:
    """The executor the settings ask for; ExecutorError (one line) when it cannot work here."""
    if settings.executor == "local":
        return LocalExecutor()
    if settings.executor == "ray":
        from autoloop.execution.executors.ray_executor import RayExecutor

        return RayExecutor.from_settings(settings, Path(root))
    from autoloop.execution.executors.slurm import SlurmExecutor  # imports submitit
    from autoloop.execution.executors.slurm_steps import SlurmStepExecutor, wants_steps

    if wants_steps(settings, os.environ):
        return SlurmStepExecutor.from_settings(settings, Path(root))
    return SlurmExecutor.from_settings(settings, Path(root))


def cancel_job(job: dict[str, Any] | None) -> str | None:
    """Cancel a job recorded by an interrupted run (state.json); what was done, or None."""
    if job and job.get("executor") == "ray":
        from autoloop.execution.executors.ray_recovery import cancel_recorded

        return cancel_recorded(job)
    if not job or job.get("executor") != "slurm":
        return None
    if job.get("cluster") == "steps":
        from autoloop.execution.executors.slurm_steps import cancel_recorded_step

        return cancel_recorded_step(job)
    from autoloop.execution.executors.slurm import cancel_recorded_job

    return cancel_recorded_job(job)


def wait_for_job(job: dict[str, Any] | None, until: float,
                 stop_event: threading.Event | None = None,
                 on_progress: Callable[[str], None] | None = None) -> bool:
    """Wait for a job recorded by an interrupted run (state.json) while its engine says it is
    queued or running; True when it has ended (collect_finished_job then takes its result),
    False when it is not this executor's, `until` (a time.time()) passed, or stop_event was
    set (the caller then cancels it as before)."""
    if job and job.get("executor") == "ray":
        from autoloop.execution.executors.ray_recovery import wait_recorded

        return wait_recorded(job, until, stop_event, on_progress)
    if not job or job.get("executor") != "slurm":
        return False
    if job.get("cluster") == "steps":
        from autoloop.execution.executors.slurm_steps import wait_for_recorded_step

        return wait_for_recorded_step(job, until, stop_event, on_progress)
    from autoloop.execution.executors.slurm import wait_for_recorded_job

    return wait_for_recorded_job(job, until, stop_event, on_progress)


def collect_finished_job(job: dict[str, Any] | None) -> RunOutcome | None:
    """The trustworthy outcome of an interrupted run's job that finished meanwhile, or None."""
    if job and job.get("executor") == "ray":
        from autoloop.execution.executors.ray_recovery import collect_recorded

        return collect_recorded(job)
    if not job or job.get("executor") != "slurm":
        return None
    if job.get("cluster") == "steps":
        from autoloop.execution.executors.slurm_steps import collect_finished_step

        return collect_finished_step(job)
    from autoloop.execution.executors.slurm import collect_finished

    return collect_finished(job)
