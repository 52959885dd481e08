"""The ``slurm`` executor: each trial is a job submitted through submitit.

The job runs :func:`run_on_node`, which calls ``runner.run_process`` ON THE NODE: the hard
timeout, the streamed log in results/runs/, the result file and its nonce, the memory cap
and the whole-tree kill are the same code as with the local executor. The job returns the
RunOutcome as a dict. So results/ (and the workspace) must be on a filesystem the nodes
share with the login node that runs the loop.

The orchestrator side submits, records the job (``on_job``: state.json, for recovery),
follows the log for progress lines, cancels the job when the loop is stopped, and turns a
job that ended without an outcome (cancelled by the scheduler, preempted, its node died,
killed, or the job function raised) into a RunOutcome with ``job_error`` set: classified
as a crash whose reason names the job id and what submitit said, never lost.

Clusters (``slurm_cluster``): ``slurm`` (sbatch), ``local`` (submitit's LocalExecutor: a
real subprocess per job on this machine, for tests and for trying a config) and ``debug``
(submitit's DebugExecutor: the job function runs in this process).

On the node, SIGTERM (scancel, the time limit, preemption) and SIGINT end the trial through
run_process's stop event, so its process tree is ended, not orphaned, and the outcome still
comes back. A job preempted or whose node failed is submitted again once (Slurm's own
requeue is off): neither says anything of the trial. Past ``slurm_retries`` such an end is
still the cluster's: the outcome's ``cluster_ended`` says so, and the attempt is recorded as
``ended`` (not a crash, not a discard).
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import psutil

from autoloop.core.durations import format_duration
from autoloop.execution.executors import ExecutorError, OnJob, OnProgress, OnStart
from autoloop.execution.executors.node_trial import LogFollower, for_the_node, no_result_outcome, nonce_digest
from autoloop.execution.executors.resubmit import BACKOFF_S, with_resubmission
from autoloop.execution.executors.slurm_gpus import gpu_plan, multi_parameters, this_node
from autoloop.execution.executors.slurm_site import site_job
from autoloop.execution.executors.slurm_state import (
    LIVE,
    QuietWatcher,
    base_state,
    describe,
    placement,
    read_job,
    settled,
    wait_while_live,
)
from autoloop.execution.procs import end_token_holders
from autoloop.execution.runner import RunOutcome, RunSpec, run_process

if TYPE_CHECKING:
    from submitit import Job

    from autoloop.config.settings import Settings

try:
    import submitit
    from submitit.core.utils import FailedJobError, pickle_load
except ImportError:   # optional dependency: only `--executor slurm` needs it
    submitit = None  # type: ignore[assignment]  # mypy sees the module; every use checks for None

T = TypeVar("T")

# State updates in a row that find a job without a result PREEMPTED (its end: requeue is off)
# or without a word from the cluster (forgotten): two, so that a job still completing (its
# result on its way) is not taken for one.
GONE_AFTER = 2
TIME_MARGIN_S = 300     # scheduler limit = trial timeout + this: job start-up, imports, the tree kill
POLL_S = 1.0            # how often the orchestrator looks at the job and its log
LOCAL_RESULT_WAIT_S = 2  # submitit waits this long for a result pickle (15 s: for network filesystems)
def time_limit_minutes(settings: Settings) -> int:
    """The scheduler's limit per job, in whole minutes (sbatch --time)."""
    seconds = settings.slurm_time_limit or settings.timeout_s + TIME_MARGIN_S
    return max(1, math.ceil(seconds / 60))


def sbatch_parameters(settings: Settings, gpus: int | None = None, root: Path | None = None,
                      cluster: str = "local") -> dict[str, Any]:
    """submitit SlurmExecutor parameters from the settings (the site's part: slurm_site.py);
    ExecutorError for an option that cannot work. The job function's python, where a container
    runs it, under the key ``python``."""
    gpus = gpu_plan(settings, "local")[0] if gpus is None else gpus
    params: dict[str, Any] = {"time": time_limit_minutes(settings), "gpus_per_node": gpus,
                              **multi_parameters(gpus, settings.nodes_per_trial), "job_name": "autoloop"}
    if settings.slurm_partition:
        params["partition"] = settings.slurm_partition
    _check_typos(settings.slurm_options)
    site = site_job(settings, gpus, root or Path("."), cluster)
    params.update(site.parameters)
    if site.python:
        params["python"] = site.python
    if site.said:
        params["said"] = ", ".join(site.said)
    return params


def _check_typos(options: dict[str, Any]) -> None:
    """A key one letter from one of submitit's (``acount``) is a typo, not an sbatch option to pass on."""
    valid = submitit.SlurmExecutor._valid_parameters()
    for raw in options:
        key = str(raw).replace("-", "_")
        close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.85)
        if key not in valid and close:
            raise ExecutorError(f"slurm_options: unknown sbatch option {raw!r} (did you mean {close[0]!r}?)")


def run_on_node(spec_json: str, stop_event: threading.Event | None = None,
                on_progress: OnProgress | None = None, on_start: OnStart | None = None,
                nodes: int = 1, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job (one task per node): run the trial here, or this node's share of it when it
    spans ``nodes`` nodes, and return its RunOutcome as a dict (with ``node_signal`` when a
    signal from the scheduler ended it). submitit's result is the first node's. ``environ``:
    what says which node this is and where the first one is (a step's: slurm_steps.main)."""
    spec = RunSpec.model_validate_json(spec_json)
    if nodes > 1:
        spec = this_node(spec, nodes, os.environ if environ is None else environ)
    stop = stop_event or threading.Event()
    caught: list[str] = []
    previous: dict[signal.Signals, Any] = {}
    if stop_event is None and threading.current_thread() is threading.main_thread():
        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGUSR2:
                # submitit's --signal=USR2@90: the time limit is 90 s away, a warning for jobs
                # that checkpoint. A trial does not, so it runs on to the limit itself, where
                # Slurm's SIGTERM ends it and the job's state says TIMEOUT (stopping here left
                # a job COMPLETED, with no word of the limit, and cut the trial short).
                return
            caught.append(signal.Signals(signum).name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            previous[sig] = signal.signal(sig, handler)
    try:
        outcome = run_process(spec, on_progress=on_progress, stop_event=stop, on_start=on_start)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    data = outcome.model_dump(mode="json")
    if caught:
        data["node_signal"] = caught[0]
    return data


_NO_SUBMITIT = "--executor slurm needs submitit: pip install 'autoloop[slurm]' (or pip install submitit)"


class SlurmExecutor:
    name = "slurm"

    def __init__(self, cluster: str, folder: Path, parameters: dict[str, Any], poll_s: float = POLL_S,
                 pending_timeout_s: float | None = None, retries: int = 3, backoff: float = BACKOFF_S):
        if submitit is None:
            raise ExecutorError(_NO_SUBMITIT)
        missing = [tool for tool in ("sbatch", "srun") if cluster == "slurm" and shutil.which(tool) is None]
        if missing:
            raise ExecutorError(f"--executor slurm: {' and '.join(missing)} not found on PATH; run the loop on a "
                                "Slurm login node (or --slurm-cluster local to try it on this machine)")
        parameters = dict(parameters)
        self.retries, self.backoff_s = retries, backoff
        self.cluster = cluster
        self.folder = Path(folder).absolute()
        self.poll_s = poll_s
        self.pending_timeout_s = pending_timeout_s
        self.submitit: submitit.Executor
        self.plan: str | None = None   # what the job asks for and why, said once at start
        # On a cluster Slurm binds each job's GPUs on its node; submitit's local and debug
        # clusters run the trial on this machine, where the slots' devices apply as with --executor local.
        self.places_devices = cluster == "slurm"
        # One task per node, each a share of the trial (submitit's local executor runs one task).
        self.nodes = int(parameters.get("nodes", 1)) if cluster == "slurm" else 1
        if cluster == "slurm":
            # max_num_timeout=0: a trial is not checkpointable, a timed-out job is not requeued.
            # Job states from scontrol (sacct where accounting runs), without a warning per poll.
            if not isinstance(submitit.SlurmJob.watcher, QuietWatcher):
                submitit.SlurmJob.watcher = QuietWatcher(delay_s=60)
            try:
                python = parameters.pop("python", None)   # a container's: the job function runs in it
                self.submitit = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=0, python=python)
                # --no-requeue: a job Slurm requeued would run again under the same id after its
                # first run's result file was written, and submitit would read that one; so a
                # preempted job ends PREEMPTED and this loop submits the trial again (run()).
                # signal_delay_s=0: no USR2 warning before the time limit (submitit's default
                # sends it 90 s ahead, for checkpointing, to every process of the step: the
                # trial died of it, and the job ended COMPLETED, not TIMEOUT).
                extra = {"no_requeue": True, **parameters.get("additional_parameters", {})}
                self.submitit.update_parameters(**{"signal_delay_s": 0, **parameters, "additional_parameters": extra})
            except (RuntimeError, ValueError) as exc:   # submitit's own checks
                raise ExecutorError(f"--executor slurm: {_said(exc)}") from None
        elif cluster == "local":
            self.submitit = submitit.LocalExecutor(folder=self.folder, max_num_timeout=0)
            self.submitit.update_parameters(timeout_min=parameters["time"], gpus_per_node=parameters["gpus_per_node"])
        else:
            self.submitit = submitit.DebugExecutor(folder=self.folder)

    @classmethod
    def from_settings(cls, settings: Settings, root: Path) -> SlurmExecutor:
        if submitit is None:
            raise ExecutorError(_NO_SUBMITIT)
        folder = Path(settings.slurm_folder)
        gpus, why = gpu_plan(settings, settings.slurm_cluster)
        params = sbatch_parameters(settings, gpus, Path(root), settings.slurm_cluster)
        said = params.pop("said", None)
        executor = cls(settings.slurm_cluster, folder if folder.is_absolute() else Path(root) / folder,
                       params, pending_timeout_s=settings.slurm_pending_timeout, retries=settings.slurm_retries)
        executor.plan = why + (f"; {said}" if said and settings.slurm_cluster == "slurm" else "")
        return executor

    # -- one trial ---------------------------------------------------------------------------

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome:
        """The trial as a job; a job the cluster preempted, lost, or whose node failed, is
        submitted again, ``retries`` times after a growing wait (sbatch --no-requeue: this loop
        requeues, not Slurm, see :func:`sbatch_parameters`)."""
        outcome = with_resubmission(lambda: self._run_job(spec, on_progress, stop_event, on_start, on_job),
                                    Path(spec.log_path).absolute(), stop_event, self.retries, self.backoff_s)
        if self.cluster == "slurm" and outcome.job.get("job_id"):
            # Where it ran, for every record: a partition mixing GPU models changes the speed
            # (and train.py's batch) between trials.
            found = placement(read_job(str(outcome.job["job_id"])))
            outcome = outcome.model_copy(update={"job": {**outcome.job, **found}})
        return outcome

    def _run_job(self, spec: RunSpec, on_progress: OnProgress | None, stop_event: threading.Event | None,
                 on_start: OnStart | None, on_job: OnJob | None) -> RunOutcome:
        spec, token = for_the_node(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        started_at, t0 = time.time(), time.monotonic()
        follower = LogFollower(spec.log_path)
        if self.cluster == "debug":
            # In this process: the stop event and callbacks reach run_process directly.
            job = self.submitit.submit(run_on_node, spec.model_dump_json(), stop_event, on_progress, on_start)
        else:
            try:
                if self.cluster == "slurm":   # squeue then says which trial a job is
                    self.submitit.update_parameters(job_name=spec.name or "autoloop")
                job = self.submitit.submit(run_on_node, spec.model_dump_json(), nodes=self.nodes)
            except Exception as exc:  # sbatch refused it: recorded like a launch failure
                return no_result_outcome(spec, started_at, t0, follower,
                                         {"executor": self.name, "cluster": self.cluster},
                                         launch_error=f"job submission failed: {_said(exc)}")
        info: dict[str, Any] = {"executor": self.name, "cluster": self.cluster, "job_id": str(job.job_id),
                                **({"job_name": spec.name} if spec.name and self.cluster == "slurm" else {}),
                                **_job_logs(job)}
        self._announce(job, {**info, "nonce_sha256": nonce_digest(spec.env.get("AUTOLOOP_NONCE"))}, on_start, on_job)
        end = _JobEnd()
        self._wait(job, spec, t0, follower, stop_event, on_progress, end)
        follower.poll(on_progress)
        if end.pending_expired is not None:
            info["job_state"] = "PENDING_LIMIT"   # the queue's doing, not the trial's: submitted again (run())
            return no_result_outcome(spec, started_at, t0, follower, info,
                                     job_error=None if end.stopped else end.pending_expired, stopped=end.stopped,
                                     note=end.pending_expired)
        if self.cluster == "local":
            # A job killed on this machine leaves its trial running: end it (a real cluster's
            # scheduler ends everything in the job's cgroup).
            _end_strays(job, token, spec.log_path)
        if end.failure is not None or not isinstance(end.data, dict):
            error, timed_out, info["job_state"] = _no_outcome_error(job, end.failure, end.data)
            return no_result_outcome(spec, started_at, t0, follower, info, job_error=None if end.stopped else error,
                                     stopped=end.stopped, timed_out=timed_out and not end.stopped, note=error)
        return _node_outcome(job, end.data, info, end.stopped)

    def _wait(self, job: Job[Any], spec: RunSpec, t0: float, follower: LogFollower,
              stop_event: threading.Event | None, on_progress: OnProgress | None, end: _JobEnd) -> None:
        """Wait for the job, cancelling it on a stop request or past the pending limit, and
        take its result into ``end`` (filled as it goes: what was done stays on an error)."""
        try:
            if self.cluster == "debug":
                end.failure = job.exception()   # runs it; unlike result(), never opens a debugger on an error
            else:
                while not job.done():
                    self._look(job, spec, t0, stop_event, end)
                    follower.poll(on_progress)
                    gone = self._gone(job)
                    if gone is not None:
                        # submitit would wait for ever: PREEMPTED and UNKNOWN are not "done" to it.
                        end.failure = gone
                        break
                    time.sleep(self.poll_s)
            if end.failure is None and end.pending_expired is None:
                end.data = job.results()[0]   # a job over several nodes: the first node's is the trial's
        except Exception as exc:  # a failed job, or an unreadable result pickle: the job gave no outcome
            end.failure = exc
        end.stopped = end.stopped or (stop_event is not None and stop_event.is_set())

    def _look(self, job: Job[Any], spec: RunSpec, t0: float, stop_event: threading.Event | None,
              end: _JobEnd) -> None:
        """One look at a job not done yet: cancel it on a stop request, or once past the pending limit."""
        if stop_event is not None and stop_event.is_set() and not end.stopped:
            self._cancel(job)
            end.stopped = True
        if end.pending_expired is None and not end.stopped and self._pending_too_long(spec, t0):
            end.pending_expired = (f"job {job.job_id} still waiting in the queue after "
                                   f"{format_duration(self.pending_timeout_s or 0)} (state {_job_state(job)}; "
                                   "slurm_pending_timeout): cancelled")
            self._cancel(job)

    def _gone(self, job: Job[Any]) -> JobGone | None:
        """The job ended without a result as far as the shared watcher's last update saw: preempted
        (requeue is off, so that is its end), or forgotten by the cluster (no word of it), each
        in ``GONE_AFTER`` updates in a row. None while it may still give one."""
        watcher = submitit.SlurmJob.watcher if self.cluster == "slurm" else None
        if not isinstance(watcher, QuietWatcher) or job.paths.result_pickle.exists():
            return None
        job_id = str(job.job_id)
        state, n = watcher.streak(job_id)
        if n < GONE_AFTER:
            return None
        if state == "PREEMPTED":
            return JobGone(f"job {job_id} was preempted and left no result", "PREEMPTED")
        if state == "MISSING":
            return JobGone(f"job {job_id} is no longer known to the cluster (slurmctld forgot it: MinJobAge "
                           "passed, no job accounting) and left no result", "LOST")
        return None

    def _pending_too_long(self, spec: RunSpec, t0: float) -> bool:
        """The job has not started the trial (run_process on the node creates its log first
        thing, whatever the cluster) and has waited past the pending limit."""
        return (self.pending_timeout_s is not None and time.monotonic() - t0 > self.pending_timeout_s
                and not spec.log_path.exists())

    def _announce(self, job: Job[Any], info: dict[str, Any], on_start: OnStart | None, on_job: OnJob | None) -> None:
        """Tell the orchestrator which job (and, on this machine, which process) runs the trial;
        with a digest of the trial's nonce, so that recovery can trust what the job left."""
        recorded = {**info, "folder": str(self.folder)}
        if self.cluster == "local":
            job._results_timeout_s = LOCAL_RESULT_WAIT_S   # same filesystem: no cache to wait for
            with contextlib.suppress(psutil.Error, ValueError):
                pid = int(job.job_id)   # submitit's local job id is its controller's pid
                recorded["pid"], recorded["create_time"] = pid, psutil.Process(pid).create_time()
        if on_job is not None:
            _quietly(on_job, recorded)
        if on_start is not None and "pid" in recorded:
            _quietly(on_start, [(recorded["pid"], recorded["create_time"])])

    def _cancel(self, job: Job[Any]) -> None:
        if self.cluster == "local":
            # SIGTERM to the controller reaches the job as SIGTERM: run_process ends the tree and
            # the outcome comes back (submitit's cancel, SIGINT, SIGKILLs the job after 1 s).
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(job.job_id), signal.SIGTERM)
        else:
            with contextlib.suppress(Exception):
                job.cancel(check=False)



def _quietly(hook: Callable[[T], None], value: T) -> None:
    try:
        hook(value)
    except Exception:  # the job is running; recovery is best effort
        pass


@dataclass
class _JobEnd:
    """How waiting for a job ended."""

    failure: BaseException | None = None    # why it gave no result
    data: object = None                     # what the job returned (an outcome's dict)
    stopped: bool = False                   # a stop request cancelled it
    pending_expired: str | None = None      # it waited in the queue past the limit: why it was cancelled


def _end_strays(job: Job[Any], token: str, log_path: Path) -> None:
    strays = end_token_holders(token)
    if strays:
        with contextlib.suppress(OSError), open(log_path, "a") as f:
            f.write(f"\n[autoloop] ended {strays} trial process(es) left by job {job.job_id}\n")


class JobGone(ExecutorError):
    """A job that ended without a result while submitit would still wait for it; ``state``: its end."""

    def __init__(self, message: str, state: str):
        super().__init__(message)
        self.state = state


def _no_outcome_error(job: Job[Any], failure: BaseException | None, data: object) -> tuple[str, bool, str]:
    """Why a job gave no trial outcome, whether the scheduler's time limit ended it, and its state."""
    state = failure.state if isinstance(failure, JobGone) else _job_state(job, ended=True)
    what = _said(failure) if failure is not None else f"returned {type(data).__name__}, not an outcome"
    error = f"job {job.job_id} ended without a trial outcome (state {state}): {what}"
    timed_out = state.upper().startswith("TIMEOUT")
    if state.upper().startswith("OUT_OF_MEMORY"):
        error = f"job {job.job_id} ran out of memory: Slurm's limit for the job (state {state}): {what}"
    if timed_out:
        error = f"job {job.job_id} hit the scheduler's time limit (state {state}): {what}"
    return error, timed_out, state


def _node_outcome(job: Job[Any], data: dict[str, Any], info: dict[str, Any], stopped: bool) -> RunOutcome:
    """The outcome the node returned, with the job; a stop nobody here asked for is the scheduler's."""
    node_signal = data.pop("node_signal", None)
    outcome = RunOutcome.model_validate(data)
    update: dict[str, Any] = {"job": info}
    ended_by_signal = outcome.killed_reason == "stopped" or outcome.signal is not None
    if ended_by_signal and stopped:
        # Our scancel signals every process of the job, so the trial often dies of it before
        # the job's handler marks the run stopped: still the stop this loop asked for.
        update["killed_reason"] = "stopped"
    elif ended_by_signal:
        update.update(_scheduler_ended(job, node_signal, outcome.killed_reason == "stopped", info))
    return outcome.model_copy(update=update)


def _scheduler_ended(job: Job[Any], node_signal: str | None, caught: bool, info: dict[str, Any]) -> dict[str, Any]:
    """The outcome's update when the scheduler, not this loop, may have ended the job: its
    signal reached the node (``caught``), or the trial died of a signal that could be the
    scheduler's (scancel signals every process of the job, so the trial can die before the
    job's handler sees anything). The cluster's final state decides, in its own words."""
    state = _job_state(job, ended=True)
    word = state.split()[0].upper() if state else "UNKNOWN"
    if not caught and word in ("COMPLETED", "UNKNOWN", "FAILED"):
        return {}   # a trial that died of a signal of its own: the runner's classification stands
    timed_out = word == "TIMEOUT" or node_signal == "SIGUSR2"
    how = {"TIMEOUT": "time limit", "PREEMPTED": "preemption", "NODE_FAIL": "its node failed",
           "CANCELLED": "cancelled", "REQUEUED": "requeued", "PENDING": "requeued",
           "OUT_OF_MEMORY": "out of memory: the job passed its memory limit (slurm_mem_per_gpu)",
           }.get(word, "preemption or scancel")
    return {"job_error": f"job {job.job_id} was ended by the scheduler ({how}; {node_signal or 'a signal'} on its "
                         f"node; state {state})", "timed_out": timed_out, "job": {**info, "job_state": state}}


def _job_logs(job: Job[Any]) -> dict[str, str]:
    """Where the job's own stdout/stderr are (submitit's files), for the ledger record."""
    try:
        return {"job_stdout": str(job.paths.stdout), "job_stderr": str(job.paths.stderr)}
    except Exception:  # the debug executor has none worth naming
        return {}


def _job_state(job: Job[Any], ended: bool = False) -> str:
    """The job's state; ``ended``: the job gave its answer, wait for the cluster's final word."""
    if isinstance(job, submitit.SlurmJob):   # the cluster's own words: "CANCELLED by 0", "NODE_FAIL", ...
        info = settled(str(job.job_id)) if ended else read_job(str(job.job_id))
        if info:
            return describe(info)
    try:
        return str(job.state)
    except Exception:  # sacct unreachable: the state is only evidence
        return "UNKNOWN"


def _said(exc: BaseException) -> str:
    """What submitit said, on one line: the last line of a job's traceback, else the first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and set(line.strip()) != {"-"}]
    if not lines:
        return type(exc).__name__
    if isinstance(exc, FailedJobError if submitit else ()) and len(lines) > 1:
        # "...with trace: <traceback> You can check full logs with ...": the exception line.
        end = next((i for i, line in enumerate(lines) if line.startswith("You can check")), len(lines))
        return lines[end - 1] if end > 1 else lines[0]
    return lines[0]


def test_only(settings: Settings, root: Path) -> tuple[bool, str]:
    """``sbatch --test-only`` of a trial's job with the night's options (partition, GPUs, CPUs,
    memory, setup, container, pass-through options): (whether Slurm would take it, what it said,
    one line). Nothing is queued."""
    import subprocess
    import tempfile

    try:
        executor = SlurmExecutor.from_settings(settings, root)
    except ExecutorError as exc:
        return False, str(exc)
    sub = executor.submitit
    if not isinstance(sub, submitit.SlurmExecutor):
        return False, f"--slurm-cluster {settings.slurm_cluster} submits no sbatch job"
    text = sub._make_submission_file_text(sub._submitit_command_str, "test-only")
    with tempfile.TemporaryDirectory(prefix="autoloop-sbatch-") as tmp:
        script = Path(tmp) / "trial.sh"
        script.write_text(text)
        try:
            proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"sbatch --test-only did not answer: {exc}"
    said = " ".join((proc.stderr + proc.stdout).split()).replace("sbatch: ", "")
    return proc.returncode == 0, said or f"sbatch --test-only exited {proc.returncode}"


def cancel_recorded_job(job: dict[str, Any]) -> str | None:
    """Cancel the job of an interrupted run, from what state.json recorded."""
    cluster, job_id = job.get("cluster"), job.get("job_id")
    if cluster == "local" and job.get("pid"):
        try:
            proc = psutil.Process(int(job["pid"]))
            if abs(proc.create_time() - float(job.get("create_time", 0))) >= 1.0:
                return None   # the pid now belongs to another process
            proc.send_signal(signal.SIGTERM)   # the controller forwards it to the job
        except (psutil.Error, ValueError):
            return None
        return f"cancelled local job {job_id}"
    if cluster == "slurm" and job_id:
        return settle_orphan(str(job_id), job)
    return None


def _scancel(job: dict[str, Any], job_id: str) -> str:
    if submitit is not None and shutil.which("scancel"):
        try:
            submitit.SlurmJob(folder=job.get("folder") or ".", job_id=str(job_id)).cancel(check=False)
        except Exception as exc:  # recovery goes on; the user can scancel
            return f"could not cancel slurm job {job_id} ({exc}); scancel it"
        return f"cancelled slurm job {job_id}"
    return f"slurm job {job_id} may still run: scancel not found here; scancel it"


def collect_finished(job: dict[str, Any] | None) -> RunOutcome | None:
    """The outcome of a run's job that finished after a kill -9 of its orchestrator, when it
    can be trusted: the cluster says the job ended, the job itself returned an outcome
    (submitit's result file: run_process on the node checked the result's nonce), that outcome
    ended by itself with a metric, and its result carries the nonce recorded at submission.
    None otherwise (the trial is then recorded as interrupted)."""
    if submitit is None or not job or job.get("cluster") != "slurm" or not job.get("nonce_sha256"):
        return None
    info = read_job(str(job.get("job_id")))
    if not info or base_state(info) in LIVE:
        return None
    try:
        paths = submitit.SlurmJob(folder=job["folder"], job_id=str(job["job_id"])).paths
        status, data = pickle_load(paths.result_pickle)
    except Exception:  # no result file, a failed job's, or not an outcome: nothing to collect
        return None
    if status != "success" or not isinstance(data, dict):
        return None
    return trusted_outcome(data, job, describe(info))


def trusted_outcome(data: dict[str, Any], job: dict[str, Any], job_state: str) -> RunOutcome | None:
    """The outcome a job or a step (slurm_steps) left after its orchestrator's kill -9, when it
    ended by itself with a metric and its result carries the nonce recorded at submission
    (state.json's digest); None otherwise."""
    try:
        outcome = RunOutcome.model_validate({k: v for k, v in data.items() if k != "node_signal"})
    except ValueError:   # pydantic's ValidationError: not an outcome
        return None
    if (outcome.metric is None or outcome.killed_reason or outcome.signal is not None or data.get("node_signal")
            or nonce_digest((outcome.result or {}).get("nonce")) != job.get("nonce_sha256")):
        return None
    kept = {k: v for k, v in job.items() if k not in ("folder", "nonce_sha256", "pid", "create_time")}
    return outcome.model_copy(update={"job": {**kept, "job_state": job_state, "collected": True}})


def wait_for_recorded_job(job: dict[str, Any], until: float, stop_event: threading.Event | None = None,
                          on_progress: OnProgress | None = None) -> bool:
    """Wait for the job of a run killed with -9 while the cluster says it is queued or running
    (executors.wait_for_job). Only a cluster's job is waited for: submitit's local jobs were
    the dead orchestrator's children (recovery cancels them, as before)."""
    if job.get("cluster") != "slurm" or not job.get("job_id"):
        return False
    job_id = str(job["job_id"])

    def look() -> str | None:
        info = read_job(job_id)
        if not info:
            return ""
        return describe(info) if base_state(info) in LIVE else None

    return wait_while_live(f"slurm job {job_id}", look, until, stop_event, on_progress)


def settle_orphan(job_id: str, job: dict[str, Any]) -> str:
    """The job of a run killed with -9: cancelled while the cluster still holds it; if it had
    ended, said so with its state (its trial is recorded as interrupted either way)."""
    info = read_job(job_id)
    state = describe(info) if info else "not known to scontrol/sacct"
    if info and base_state(info) not in LIVE:
        return f"slurm job {job_id} of the interrupted trial had ended ({state}); nothing to cancel"
    return f"{_scancel(job, job_id)} (was {state})"
