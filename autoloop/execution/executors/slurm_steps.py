"""The ``slurm`` executor inside an allocation: each trial is a job step (``srun --exact``).

A night started inside an ``sbatch`` script or a ``salloc`` shell (``SLURM_JOB_ID`` set)
already holds its nodes, so a trial does not wait in the queue, pay a prolog or land on a
new node with a cold compile cache: it becomes a step of the allocation. ``--exact`` gives
each step only the CPUs, memory and GPUs it asks for, so ``--workers N`` steps run side by
side on disjoint CPUs and GPUs (Slurm binds them: ``CUDA_VISIBLE_DEVICES`` in the step);
a step that does not fit yet waits for one to end, inside the allocation.

The step runs the same node-side code as a job per trial (:func:`slurm.run_on_node`: the
runner's hard timeout, the log in results/runs/, the result file and its nonce, the
whole-tree kill), started by ``python -m autoloop.execution.executors.slurm_steps SPEC OUT``;
it writes the outcome as JSON where the orchestrator reads it (results/ is on the filesystem
the allocation's nodes share, as for jobs).

Stopping: ``scancel --signal=TERM <job>.<step>`` reaches the step's task, whose handler ends
the trial's tree and still writes the outcome; only then, or after a grace, is srun itself
ended (its own SIGTERM cancels the step at once with SIGKILL, which would lose the outcome).
srun runs in a session of its own so that a terminal's Ctrl-C reaches only the orchestrator.
After a ``kill -9`` of the orchestrator the step runs on (srun is in a session of its own);
``--resume`` re-attaches to the step state.json names (:func:`wait_for_recorded_step`), then
takes the outcome it wrote with the nonce check (:func:`collect_finished_step`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoloop.execution.executors import ExecutorError, OnJob, OnProgress, OnStart
from autoloop.execution.executors.node_trial import LogFollower, for_the_node, no_result_outcome, nonce_digest
from autoloop.execution.executors.resubmit import BACKOFF_S, backoff_s, set_aside_log
from autoloop.execution.executors.slurm import (
    POLL_S,
    _quietly,
    run_on_node,
    time_limit_minutes,
    trusted_outcome,
)
from autoloop.execution.executors.slurm_gpus import gpus_asked
from autoloop.execution.executors.slurm_state import LIVE, TIMEOUT_S, base_state, describe, read_job, wait_while_live
from autoloop.execution.runner import RunOutcome, RunSpec

if TYPE_CHECKING:
    from autoloop.config.settings import Settings

STOP_GRACE_S = 60.0   # after scancel --signal=TERM: the runner's own tree kill takes up to its grace (30 s)
# Passed through to every step where the user set them (slurm_options): the rest of
# slurm_options are sbatch's, for the allocation, which the night's script already made.
_STEP_OPTIONS = ("cpus_per_task", "mem", "mem_per_cpu", "mem_per_gpu", "cpus_per_gpu")


def inside_allocation(environ: Mapping[str, str]) -> str | None:
    """The allocation this process runs in (``SLURM_JOB_ID``), or None."""
    return environ.get("SLURM_JOB_ID") or None


def wants_steps(settings: Settings, environ: Mapping[str, str]) -> bool:
    """Whether trials run as steps: ``slurm_mode = "steps"``, or ``auto`` inside an allocation."""
    mode = settings.slurm_mode
    return settings.slurm_cluster == "slurm" and (
        mode == "steps" or (mode == "auto" and inside_allocation(environ) is not None))


def step_options(settings: Settings, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """srun's options for one trial's step, and the line saying what each step gets and why.

    GPUs: ``gpus_per_trial`` when set, else one where the allocation has GPUs on its node
    (``SLURM_GPUS_ON_NODE``), else none. CPUs: ``cpus_per_task`` from slurm_options, else the
    allocation's CPUs on the node shared evenly by the workers (srun does not inherit sbatch's
    ``--cpus-per-task`` since Slurm 22.05, so a step would otherwise get one). Memory: ``mem``
    from slurm_options, else the allocation's ``--mem`` shared likewise (a step asks for all of
    it otherwise, and on a site that counts memory the second step would wait for the first).
    """
    nodes = max(1, settings.nodes_per_trial)
    workers = max(1, settings.workers)
    asked = gpus_asked(settings)
    on_node = allocation_gpus(environ)
    if settings.device == "cpu":
        gpus, why = 0, "no GPU (--device cpu)"
    elif asked is not None:
        gpus, why = asked, f"{asked} GPU(s) (gpus_per_trial)"
    else:
        gpus = 1 if on_node else 0
        why = f"1 GPU (the allocation has {on_node} on its node)" if on_node else "no GPU (the allocation has none)"
    opts = {key.replace("-", "_"): value for key, value in settings.slurm_options.items()}
    # In a step of its own (the night's sbatch script), the orchestrator's CPUs are not the trials'.
    in_step = environ.get("SLURM_STEP_ID") is not None
    own = _int(environ.get("SLURM_CPUS_ON_NODE")) if in_step else 0
    cpus = opts.get("cpus_per_task")
    if cpus is None and "cpus_per_gpu" not in opts:
        cpus = max(1, (_int(environ.get("SLURM_JOB_CPUS_PER_NODE")) - own) // workers)
    # Over several nodes: one task per node, each starting its node's share (slurm_gpus.this_node).
    argv = ["--exact", f"--nodes={nodes}", f"--ntasks={nodes}", *(["--ntasks-per-node=1"] if nodes > 1 else []),
            f"--time={time_limit_minutes(settings)}"]
    if cpus is not None:
        argv.append(f"--cpus-per-task={cpus}")
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    mem_per_node = 0 if in_step else _int(environ.get("SLURM_MEM_PER_NODE"))   # a step's own says nothing
    if not {"mem", "mem_per_cpu", "mem_per_gpu"} & opts.keys() and mem_per_node:
        argv.append(f"--mem={max(1, mem_per_node // workers)}M")
    for key in _STEP_OPTIONS:
        if key in opts and key != "cpus_per_task":
            argv.append(f"--{key.replace('_', '-')}={opts[key]}")
    cpus_said = f"{cpus} CPU(s)" if cpus is not None else f"{opts['cpus_per_gpu']} CPU(s) per GPU"
    where = f" on each of {nodes} nodes" if nodes > 1 else ""
    plan = (f"slurm: each trial is a step of allocation {inside_allocation(environ)} (srun --exact, no queue): "
            f"{why}, {cpus_said}{where}; {workers} at once")
    return argv, plan


def allocation_gpus(environ: Mapping[str, str]) -> int:
    """GPUs the allocation has on this node: the job's, not those of the step the orchestrator
    may run in (``--gres=none``: none)."""
    listed = environ.get("SLURM_JOB_GPUS") or ""
    return (_int(environ.get("SLURM_GPUS_PER_NODE")) or len([g for g in listed.split(",") if g.strip()])
            or _int(environ.get("SLURM_GPUS_ON_NODE")))


def _int(value: str | None) -> int:
    """The leading number of a Slurm count (``SLURM_CPUS_ON_NODE=8``, ``SLURM_GPUS_ON_NODE``), else 0."""
    digits = ""
    for ch in (value or "").strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else 0


class SlurmStepExecutor:
    """Trials as steps of the allocation the loop runs in."""

    name = "slurm"
    # Slurm binds each step's GPUs on its node (CUDA_VISIBLE_DEVICES): the orchestrator's own
    # view of devices, from a CPU step or a login node, must not be shipped over it.
    places_devices = True

    def __init__(self, folder: Path, srun_options: list[str], job_id: str, plan: str | None = None,
                 poll_s: float = POLL_S, stop_grace_s: float = STOP_GRACE_S, retries: int = 3,
                 backoff: float = BACKOFF_S):
        missing = [tool for tool in ("srun", "scancel") if shutil.which(tool) is None]
        if missing:
            raise ExecutorError(f"slurm steps: {' and '.join(missing)} not found on PATH")
        self.folder = Path(folder).absolute()
        self.srun_options = srun_options
        self.job_id = job_id
        self.plan = plan
        self.poll_s = poll_s
        self.stop_grace_s = stop_grace_s
        self.retries, self.backoff_s = retries, backoff
        nodes = next((o.split("=", 1)[1] for o in srun_options if o.startswith("--nodes=")), "1")
        self.nodes = int(nodes) if nodes.isdigit() else 1

    @classmethod
    def from_settings(cls, settings: Settings, root: Path,
                      environ: Mapping[str, str] | None = None) -> SlurmStepExecutor:
        environ = os.environ if environ is None else environ
        job_id = inside_allocation(environ)
        if job_id is None:
            raise ExecutorError("slurm_mode steps: this loop does not run inside a Slurm allocation (SLURM_JOB_ID "
                                "is not set); start it in an sbatch script or a salloc shell, or use "
                                "slurm_mode = \"jobs\"")
        folder = Path(settings.slurm_folder)
        options, plan = step_options(settings, environ)
        return cls((folder if folder.is_absolute() else Path(root) / folder) / "steps", options, job_id, plan,
                   retries=settings.slurm_retries)

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome:
        """The trial as a step; a step whose node failed is started again, ``retries`` times after a
        growing wait, as a job per trial is submitted again (slurm.SlurmExecutor.run): the step
        lands on a node the allocation still has (an allocation made with ``--no-kill`` keeps the
        others when one fails). Past the retries, or when the allocation itself is gone, the end
        is the cluster's (``cluster_ended``), never the change's crash."""
        resubmitted: list[str] = []
        while True:
            outcome = self._run_step(spec, on_progress, stop_event, on_start, on_job)
            stopped = stop_event is not None and stop_event.is_set()
            why = outcome.job.pop("cluster_end", None)
            if why is None or stopped:
                break
            allocation_gone = why.startswith("lost its allocation")
            if allocation_gone or len(resubmitted) >= self.retries:
                tries = f" (started {len(resubmitted) + 1} times)" if resubmitted else ""
                outcome = outcome.model_copy(update={"cluster_ended": f"step {outcome.job['job_id']} {why}{tries}"})
                break
            resubmitted.append(f"step {outcome.job['job_id']}: {why}")
            wait = backoff_s(len(resubmitted), self.backoff_s)
            set_aside_log(spec.log_path, str(outcome.job["job_id"]), why, wait)
            if stop_event is not None and stop_event.wait(wait):
                break
            if stop_event is None:
                time.sleep(wait)
        if resubmitted:
            outcome = outcome.model_copy(update={"job": {**outcome.job, "resubmitted": resubmitted}})
        return outcome

    def _run_step(self, spec: RunSpec, on_progress: OnProgress | None, stop_event: threading.Event | None,
                  on_start: OnStart | None, on_job: OnJob | None) -> RunOutcome:
        spec, _token = for_the_node(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        name = spec.log_path.stem                      # <trial>-<attempt>, unique in the night
        files = {kind: self.folder / f"{name}.{kind}" for kind in ("spec.json", "outcome.json", "step", "out")}
        for path in (files["outcome.json"], files["step"]):
            path.unlink(missing_ok=True)
        files["spec.json"].write_text(spec.model_dump_json())
        argv = ["srun", *self.srun_options, f"--job-name=autoloop-{name}", f"--output={files['out']}",
                sys.executable, "-m", "autoloop.execution.executors.slurm_steps",
                str(files["spec.json"]), str(files["outcome.json"]), str(files["step"]), str(self.nodes)]
        started_at, t0 = time.time(), time.monotonic()
        follower = LogFollower(spec.log_path)
        info: dict[str, Any] = {"executor": self.name, "cluster": "steps", "job_id": self.job_id,
                                "job_stdout": str(files["out"])}
        srun_said = files["out"].with_suffix(".srun")
        said_from = srun_said.stat().st_size if srun_said.exists() else 0   # this step's words only
        try:
            with open(srun_said, "ab") as said:   # srun's own words (waiting, errors)
                srun = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=said, stderr=said,
                                        start_new_session=True)
        except OSError as exc:
            return no_result_outcome(spec, started_at, t0, follower, info, launch_error=f"srun did not start: {exc}")
        step: str | None = None
        stopped = signalled = False
        stop_at: float | None = None
        while srun.poll() is None:
            if step is None:
                step = _read_step(files["step"])
                if step is not None:
                    info["job_id"] = step
                    if on_job is not None:
                        _quietly(on_job, {**info, "nonce_sha256": nonce_digest(spec.env.get("AUTOLOOP_NONCE"))})
            if stop_event is not None and stop_event.is_set() and not stopped:
                stopped, stop_at = True, time.monotonic()
                if step is not None:
                    signalled = _scancel("--signal=TERM", step)
            if stopped and stop_at is not None and (not signalled or time.monotonic() - stop_at > self.stop_grace_s):
                # No step yet (srun still waits for room in the allocation) or its task does not
                # end: srun's own SIGTERM cancels the step (SIGKILL to what is left).
                with contextlib.suppress(ProcessLookupError):
                    srun.terminate()
                stop_at = None
            follower.poll(on_progress)
            with contextlib.suppress(subprocess.TimeoutExpired):
                srun.wait(self.poll_s)   # back at once when the step ends, not at the next poll
        follower.poll(on_progress)
        if step is None and (step := _read_step(files["step"])) is not None:
            # A step that ran and ended between two looks (a loaded host's thread starved for
            # longer than the step took): announced now, as every step is, once.
            info["job_id"] = step
            if on_job is not None:
                _quietly(on_job, {**info, "nonce_sha256": nonce_digest(spec.env.get("AUTOLOOP_NONCE"))})
        data = _read_outcome(files["outcome.json"])
        if data is None:
            last = _last_line(srun_said) or _last_line(files["out"])
            error = f"step {info['job_id']} ended without a trial outcome (srun exit {srun.returncode}): {last}"
            lost = None if stopped else self._lost(srun_said, said_from, _read_node(files["step"]))
            if lost is not None:
                info["cluster_end"] = lost   # run() starts it again, or says the cluster ended it
            return no_result_outcome(spec, started_at, t0, follower, info, job_error=None if stopped else error,
                                     stopped=stopped, note=error)
        node_signal = data.pop("node_signal", None)
        outcome = RunOutcome.model_validate(data)
        update: dict[str, Any] = {"job": info}
        if stopped and (outcome.killed_reason == "stopped" or outcome.signal is not None):
            update["killed_reason"] = "stopped"
        elif node_signal is not None:
            # A signal this loop did not send: the allocation's end, or a scancel from outside.
            update["job_error"] = (f"step {info['job_id']} was ended from outside ({node_signal} on its node: the "
                                   "allocation's time limit, or scancel)")
        return outcome.model_copy(update=update)


    def _lost(self, said: Path, said_from: int, node: str | None) -> str | None:
        """Why a step that gave no outcome was the cluster's doing, or None (the trial's own end):
        srun says its node failed (``srun: error: Node failure on gpu07``), the node it ran on is
        down now, or the allocation itself has ended."""
        text = ""
        with contextlib.suppress(OSError):
            text = said.read_bytes()[said_from:].decode(errors="replace")
        found = _NODE_FAILURE.search(text)
        if found:
            return f"lost its node {found[1]} (NODE_FAIL)"
        state = node_state(node) if node else ""
        if any(word in state for word in _NODE_DOWN):
            return f"lost its node {node} ({state})"
        info = read_job(self.job_id)
        if info and base_state(info) not in LIVE:
            return f"lost its allocation {self.job_id} ({describe(info)})"
        return None


# srun's own line when a node of the step fails (src/srun: "Node failure on %s").
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")
# Node states (scontrol's, upper case, with flags such as DOWN+NOT_RESPONDING) that lose a step.
_NODE_DOWN = ("DOWN", "FAIL", "NOT_RESPONDING")


def node_state(node: str) -> str:
    """scontrol's State of a node (``DOWN+NOT_RESPONDING``, ``IDLE``, ...); "" when it did not answer."""
    try:
        proc = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"\bState=(\S+)", proc.stdout) if proc.returncode == 0 else None
    return found[1].upper() if found else ""


def _read_node(path: Path) -> str | None:
    """The node the step ran on, as its task wrote it after the step id (main())."""
    with contextlib.suppress(OSError):
        parts = path.read_text().split()
        return parts[1] if len(parts) > 1 else None
    return None


def _scancel(*argv: str) -> bool:
    try:
        return subprocess.run(["scancel", *argv], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _read_step(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        parts = path.read_text().split()
        return parts[0] if parts else None
    return None


def _read_outcome(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _last_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else ""
    return ""


def cancel_recorded_step(job: dict[str, Any]) -> str | None:
    """Cancel the step of a run killed with -9 (state.json's record), and its srun."""
    step = str(job.get("job_id") or "")
    if "." not in step:
        return None
    if shutil.which("scancel") is None:
        return f"slurm step {step} may still run: scancel not found here; scancel it"
    if not _scancel(step):
        return f"slurm step {step} of the interrupted trial had ended; nothing to cancel"
    return f"cancelled slurm step {step}"


def live_steps(job_id: str) -> list[str] | None:
    """The allocation's steps Slurm still runs (``squeue -s``): [] once the allocation itself
    has ended; None when squeue did not answer."""
    try:
        proc = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return [] if "Invalid job id" in proc.stderr else None
    return proc.stdout.split()


def wait_for_recorded_step(job: dict[str, Any], until: float, stop_event: threading.Event | None = None,
                           on_progress: OnProgress | None = None) -> bool:
    """Wait for the step of a run killed with -9 while Slurm still runs it (executors.wait_for_job)."""
    step = str(job.get("job_id") or "")
    if "." not in step or shutil.which("squeue") is None:
        return False

    def look() -> str | None:
        listed = live_steps(step.split(".")[0])
        if listed is None:
            return ""
        return "RUNNING" if step in listed else None

    return wait_while_live(f"slurm step {step}", look, until, stop_event, on_progress)


def collect_finished_step(job: dict[str, Any]) -> RunOutcome | None:
    """The outcome an orphaned step wrote (next to its output, ``<trial>-<attempt>.outcome.json``)
    once it has ended, when it can be trusted (slurm.trusted_outcome: its own end, a metric, the
    nonce recorded at submission); None otherwise."""
    step, out = str(job.get("job_id") or ""), job.get("job_stdout")
    if "." not in step or not out or not job.get("nonce_sha256"):
        return None
    listed = live_steps(step.split(".")[0])
    if listed is None or step in listed:
        return None   # still running, or nobody can say: not an end to take
    data = _read_outcome(Path(out).with_suffix(".outcome.json"))
    return trusted_outcome(data, job, "COMPLETED") if data is not None else None


def main(argv: list[str]) -> int:
    """In the step (each of its tasks, one per node): run the trial, or this node's share of it
    (run_on_node), and, on the first node, write its outcome where the orchestrator reads it."""
    spec_path, outcome_path, step_path = (Path(a) for a in argv[:3])
    nodes = int(argv[3]) if len(argv) > 3 else 1
    env = os.environ
    job, step = env.get("SLURM_JOB_ID", "?"), env.get("SLURM_STEP_ID", "?")
    first = env.get("SLURM_PROCID", "0") == "0"   # one task per node: the task's rank is its node's
    if first:
        # The step id first: the orchestrator needs it to stop the step with a signal its task catches.
        # Its node after it: a step that gave no outcome is told from a lost node by that node's state.
        step_path.write_text(f"{job}.{step} {env.get('SLURMD_NODENAME', '?')}\n")
    # This node's place among the step's nodes (not the allocation's), and a rendezvous port of
    # the step's own: two trials' steps may start on one first node.
    where = {"SLURM_NODEID": env.get("SLURM_PROCID", "0"),
             "SLURM_JOB_NODELIST": env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""),
             "SLURM_JOB_ID": f"{job}{step.zfill(4)}"}
    data = run_on_node(spec_path.read_text(), nodes=nodes, environ=where)
    if not first:
        return 0   # the first node's share is the trial (its log, its result)
    tmp = outcome_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(outcome_path)   # whole or absent: never half an outcome
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
