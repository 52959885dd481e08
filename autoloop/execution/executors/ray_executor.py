"""The ``ray`` executor: each trial runs on a node of a Ray cluster, placed by Ray.

Each attempt is one named detached actor (ray_node.TrialRunner) asking Ray for
``gpus_per_trial`` GPUs and a CPU share; Ray binds the GPUs on the node it picks and sets
the actor's ``CUDA_VISIBLE_DEVICES``, which the trial inherits (``places_devices``: the
orchestrator ships no device variables of its own). Detached, in a namespace of the night,
so that a ``kill -9`` of the orchestrator leaves the trial running and ``--resume`` finds it
by name (executors/ray_recovery.py).

One node per trial (``nodes_per_trial`` 1): a trial over several nodes would need a placement
group and a launcher per node, not built here; it is refused at start in one line.

The cluster: ``--ray-address`` (else ``RAY_ADDRESS`` of the environment, else a local cluster
started for the night by ``ray.init`` and stopped with it). How the code reaches the node is
chosen at start: a probe task on every node that can take a trial looks for a file written
here into the work tree; where all see it, the filesystem is shared and the trial runs in the
work tree itself; else the worktree goes along in Ray's runtime environment (``working_dir``),
whose size Ray limits (checked at start, one line), uploaded per trial (:func:`ship`). Either
way the outcome, the result's content and (without a shared filesystem) the log come back
with the actor's answer.

A worker node lost mid-trial (its raylet gone, the machine down) is the cluster's doing: the
job's state says ``NODE_DIED`` and the trial is submitted again with the Slurm executor's
backoff (executors/resubmit.py, ``slurm_retries``), counted apart in the ledger.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoloop.core.durations import format_duration
from autoloop.execution.executors import ExecutorError, OnJob, OnProgress, OnStart
from autoloop.execution.executors.node_trial import LogFollower, for_the_node, no_result_outcome, nonce_digest
from autoloop.execution.executors.ray_head import HeadGone, leave, watch
from autoloop.execution.executors.resubmit import BACKOFF_S, with_resubmission
from autoloop.execution.procs import end_token_holders
from autoloop.execution.runner import RunOutcome, RunSpec

if TYPE_CHECKING:
    from autoloop.config.settings import Settings

_NO_RAY = "--executor ray needs ray: pip install 'autoloop[ray]' (or pip install 'ray[default]')"
POLL_S = 1.0
# Ray's GCS keeps a working_dir package whole; larger ones are refused at upload (its
# GCS_STORAGE_MAX_SIZE, 512 MiB in Ray 2.x), read from Ray where it says.
WORKING_DIR_LIMIT = 512 * 1024 * 1024
EXCLUDED = (".git", "results", "worktrees", "__pycache__", ".venv")
NODE_DEATH_WAIT_S = 60.0   # how long the cluster may take to mark a node dead after its actor died
STOP_WAIT_S = 60.0         # after a stop: the trial's grace and tree kill on the node, then the actor is killed
_live: dict[str, Any] = {}   # actor name -> handle, of this process: killed at exit whatever happens
_live_lock = threading.Lock()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError(_NO_RAY) from None
    return ray


def night_namespace(root: Path) -> str:
    """The Ray namespace of one workspace's nights: its actors, found again by --resume."""
    return "autoloop-" + hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]


def connect(address: str | None, namespace: str) -> str:
    """Join the cluster (once per process); its GCS address. No address and no RAY_ADDRESS:
    a local cluster, started here and stopped when this process ends."""
    ray = _ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False, include_dashboard=False,
                     configure_logging=True, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or "a new local cluster"
            raise ExecutorError(f"--executor ray: cannot join {where}: {_first_line(exc)}") from None
        atexit.register(_end_all)
    return str(ray.get_runtime_context().gcs_address)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in _ray().nodes() if n.get("Alive")]


def cpu_share(nodes: list[dict[str, Any]], gpus: int) -> float:
    """CPUs per trial: a GPU's share of the CPUs of the node with the most GPUs, times the trial's
    GPUs (two trials on a 4-GPU, 16-CPU node get 8 each, not all 16 with one waiting); 1 without GPUs."""
    if gpus <= 0:
        return 1.0
    node = max(nodes, key=lambda n: n["Resources"].get("GPU", 0))
    per_gpu = node["Resources"].get("CPU", 0) / max(node["Resources"].get("GPU", 1), 1)
    return max(1.0, float(int(per_gpu * gpus))) if per_gpu >= 1 else max(per_gpu * gpus, 0.1)


def check_fits(nodes: list[dict[str, Any]], gpus: int, address: str) -> None:
    """A trial that asks for more GPUs than any node has would wait for ever: one line now."""
    most = max((int(n["Resources"].get("GPU", 0)) for n in nodes), default=0)
    if gpus > most:
        raise ExecutorError(f"--gpus-per-trial {gpus}: no node of the Ray cluster at {address} has {gpus} GPUs "
                            f"(the most on one node: {most}); a trial runs on one node")


def working_dir_size(root: Path) -> int:
    """Bytes Ray would pack for ``working_dir`` (the work tree without git, results, worktrees)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED]
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def working_dir_limit() -> int:
    with contextlib.suppress(Exception):
        from ray._private.runtime_env import packaging

        return int(packaging.GCS_STORAGE_MAX_SIZE)
    return WORKING_DIR_LIMIT


def nodes_share(root: Path, nodes: list[dict[str, Any]]) -> bool:
    """Whether every node that can take a trial sees this work tree: a task pinned on each
    reads a file of random content written here (a node that mounts another tree at the same
    path reads something else)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = Path(root) / "results" if (Path(root) / "results").is_dir() else Path(root)
    marker = where / f".autoloop-ray-probe-{uuid.uuid4().hex}"
    content = uuid.uuid4().hex
    marker.write_text(content)
    try:
        probe = ray.remote(num_cpus=0)(_reads)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(marker), content) for n in nodes]
        return all(ray.get(refs, timeout=300))
    finally:
        marker.unlink(missing_ok=True)


def _reads(path: str, content: str) -> bool:
    try:
        return Path(path).read_text() == content
    except OSError:
        return False


@functools.lru_cache(maxsize=4)
def _code_plan(root: str, gpus: int) -> tuple[bool, str]:
    """(shared filesystem?, one line saying how the code reaches the nodes); asked once a process."""
    nodes = [n for n in alive_nodes() if n["Resources"].get("GPU", 0) >= gpus]
    if nodes and nodes_share(Path(root), nodes):
        return True, f"the nodes share this filesystem ({len(nodes)} checked): trials run in the work tree"
    return False, check_working_dir(Path(root))


def ship(work_tree: Path) -> str:
    """The trial's work tree uploaded to the cluster's GCS as a package; its URI for the actor's
    runtime environment. An actor's (or a task's) ``working_dir`` must be a URI: Ray uploads a
    local directory only for a whole job (``ray.init``), which would freeze the code of the
    first trial. So this is what ``ray.init`` does, per trial, through Ray's packaging module
    (not a public API; Ray 2.9-2.60 have these two functions). Content-addressed: a tree
    already there is not sent again."""
    from ray._private.runtime_env import packaging

    uri = str(packaging.get_uri_for_directory(str(work_tree), include_gitignore=True, excludes=list(EXCLUDED)))
    packaging.upload_package_if_needed(uri, tempfile.gettempdir(), str(work_tree), include_gitignore=True,
                                       excludes=list(EXCLUDED))
    return uri


def check_working_dir(root: Path) -> str:
    """One line saying the work tree goes in Ray's runtime environment; ExecutorError (one line)
    when it is over Ray's limit for a working_dir, which Ray would refuse at each trial."""
    size, limit = working_dir_size(root), working_dir_limit()
    if size >= limit:
        raise ExecutorError(f"--executor ray: the nodes do not see {root}, and the work tree ({size >> 20} MiB "
                            f"without .git, results, worktrees) is over Ray's working_dir limit ({limit >> 20} "
                            "MiB): move large files out of it, or run on a shared filesystem")
    return (f"the nodes do not see {root}: each trial's work tree goes in Ray's runtime environment "
            f"(working_dir, {size >> 20} MiB of {limit >> 20} MiB allowed)")


class RayExecutor:
    name = "ray"
    places_devices = True   # Ray binds the trial's GPUs on its node (CUDA_VISIBLE_DEVICES of the actor)

    def __init__(self, root: Path, address: str | None = None, gpus: int = 1, retries: int = 3,
                 backoff: float = BACKOFF_S, pending_timeout_s: float | None = None, poll_s: float = POLL_S,
                 shared: bool | None = None):
        self.namespace = night_namespace(root)
        self.address = connect(address, self.namespace)
        self.head = watch(self.address)   # the night stops, in one line, before Ray would end this process
        nodes = alive_nodes()
        check_fits(nodes, gpus, self.address)
        self.gpus, self.cpus = gpus, cpu_share(nodes, gpus)
        self.retries, self.backoff_s, self.poll_s = retries, backoff, poll_s
        self.pending_timeout_s = pending_timeout_s
        if shared is None:
            shared, how = _code_plan(str(Path(root).resolve()), gpus)
        else:
            how = "shared filesystem" if shared else "working_dir (as asked)"
        self.shared = shared
        self.plan: str | None = (f"ray: each trial one actor asking for {gpus} GPU(s) and {self.cpus:g} CPU(s) on one "
                                 f"node of {self.address} ({len(nodes)} node(s)); {how}")

    @classmethod
    def from_settings(cls, settings: Settings, root: Path) -> RayExecutor:
        if settings.nodes_per_trial > 1:
            raise ExecutorError(f"--executor ray runs a trial on one node; --nodes-per-trial "
                                f"{settings.nodes_per_trial} needs --executor slurm")
        return cls(root, settings.ray_address, settings.gpus_per_trial, retries=settings.slurm_retries,
                   pending_timeout_s=settings.slurm_pending_timeout)

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome:
        """The trial on the cluster; one whose node died is submitted again (executors/resubmit.py)."""
        return with_resubmission(lambda: self._run_actor(spec, on_progress, stop_event, on_job),
                                 Path(spec.log_path).absolute(), stop_event, self.retries, self.backoff_s)

    def _run_actor(self, spec: RunSpec, on_progress: OnProgress | None, stop_event: threading.Event | None,
                   on_job: OnJob | None) -> RunOutcome:
        ray = _ray()
        spec, token = for_the_node(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        started_at, t0 = time.time(), time.monotonic()
        follower = LogFollower(spec.log_path)
        name = f"{spec.name or 'trial'}-{token[:8]}"
        info: dict[str, Any] = {"executor": "ray", "job_id": name, "address": self.address,
                                "namespace": self.namespace}
        options: dict[str, Any] = {"name": name, "namespace": self.namespace, "lifetime": "detached",
                                   "num_gpus": self.gpus, "num_cpus": self.cpus, "max_restarts": 0,
                                   "max_concurrency": 4}
        from autoloop.execution.executors.ray_node import TrialRunner

        try:
            if not self.shared:
                options["runtime_env"] = {"working_dir": ship(Path(spec.cwd))}
            actor = ray.remote(TrialRunner).options(**options).remote()
        except Exception as exc:  # Ray refused it (a bad runtime environment): like a launch failure
            return no_result_outcome(spec, started_at, t0, follower, info,
                                     launch_error=f"Ray refused the trial's actor: {_first_line(exc)}")
        with _live_lock:
            _live[name] = actor
        if on_job is not None:
            with contextlib.suppress(Exception):   # recovery is best effort; the trial runs
                on_job({**info, "nonce_sha256": nonce_digest(spec.env.get("AUTOLOOP_NONCE"))})
        try:
            return self._follow(actor, spec, token, info, started_at, t0, follower, on_progress, stop_event)
        except Exception as exc:
            gone = exc if isinstance(exc, HeadGone) else self.head.failed_without()
            if gone is None:
                raise
            leave(_take_all())   # no Ray call below may wait on the dead head
            raise gone from None
        finally:
            _kill(name)

    def _follow(self, actor: Any, spec: RunSpec, token: str, info: dict[str, Any], started_at: float, t0: float,
                follower: LogFollower, on_progress: OnProgress | None,
                stop_event: threading.Event | None) -> RunOutcome:
        ray = _ray()
        start_ref = actor.start.remote(spec.model_dump_json(), not self.shared)
        where: dict[str, Any] | None = None
        stopped, data = False, None
        try:
            while data is None:
                self.head.check()
                if stop_event is not None and stop_event.is_set() and not stopped:
                    stopped = True
                    if where is None:   # not placed yet: nothing runs, nothing to wait for
                        return no_result_outcome(spec, started_at, t0, follower, info, stopped=True,
                                                 note=f"ray actor {info['job_id']} stopped before Ray placed it")
                    actor.stop.remote()
                    stop_deadline = time.monotonic() + spec.grace_s + STOP_WAIT_S
                if where is None:
                    ready, _ = ray.wait([start_ref], timeout=self.poll_s)
                    if ready:
                        where = ray.get(start_ref)
                        info.update(_placement(where))
                    elif self._pending_too_long(t0):
                        info["job_state"] = "PENDING_LIMIT"
                        why = (f"ray actor {info['job_id']} not placed after "
                               f"{format_duration(self.pending_timeout_s or 0)} (slurm_pending_timeout): killed")
                        return no_result_outcome(spec, started_at, t0, follower, info, job_error=why, note=why)
                    continue
                with contextlib.suppress(ray.exceptions.GetTimeoutError):   # a slow answer: ask again
                    data = ray.get(actor.outcome.remote(self.poll_s), timeout=self.poll_s + 120)
                if self.shared:
                    follower.poll(on_progress)
                if data is None and stopped and time.monotonic() > stop_deadline:
                    break
        except ray.exceptions.RayActorError as exc:
            return self._lost(exc, spec, token, info, where, started_at, t0, follower, stopped)
        if not isinstance(data, dict) or "node_error" in data:
            what = data.get("node_error") if isinstance(data, dict) else "no outcome in time after the stop"
            error = f"ray actor {info['job_id']} gave no trial outcome: {what}"
            return no_result_outcome(spec, started_at, t0, follower, info, stopped=stopped,
                                     job_error=None if stopped else error, note=error)
        return _outcome(data, spec, info, stopped)

    def _pending_too_long(self, t0: float) -> bool:
        return self.pending_timeout_s is not None and time.monotonic() - t0 > self.pending_timeout_s

    def _lost(self, exc: BaseException, spec: RunSpec, token: str, info: dict[str, Any],
              where: dict[str, Any] | None, started_at: float, t0: float, follower: LogFollower,
              stopped: bool) -> RunOutcome:
        """The actor died under the trial: its node died (the cluster's doing: submitted
        again), or the actor's process did (said as the job's error)."""
        said = _first_line(exc)
        node_died = where is not None and _node_died(where.get("node_id"), self.head.check)
        state = "NODE_DIED" if node_died else "ACTOR_DIED"
        info.update({"job_state": f"{state} ({said})", "ray_reason": said})
        # Where the node shared this host (a workstation, the tests' cluster), the trial's
        # processes outlive its dead actor: ended by their token. A lost machine took them along.
        strays = end_token_holders(token)
        error = (f"ray actor {info['job_id']} lost its node {info.get('node', '?')}: {said}" if node_died
                 else f"ray actor {info['job_id']} died: {said}")
        if strays:
            error += f" (ended {strays} trial process(es) it left on this machine)"
        return no_result_outcome(spec, started_at, t0, follower, info, stopped=stopped,
                                 job_error=None if stopped else error, note=error)


def _placement(where: dict[str, Any]) -> dict[str, Any]:
    """For the ledger record's extra: the trial's node and the GPU ids Ray bound to it."""
    return {"node": where.get("node_ip") or where.get("host"), "node_id": where.get("node_id"),
            "gpu_ids": where.get("gpu_ids") or [], "cuda_visible_devices": where.get("cuda_visible_devices", "")}


def _node_died(node_id: str | None, check_head: Callable[[], None], wait_s: float = NODE_DEATH_WAIT_S) -> bool:
    """Whether the cluster marks the node dead, waiting for its health checks to say so (the head
    checked meanwhile: a node lost with it is not waited for)."""
    if not node_id:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        check_head()
        with contextlib.suppress(Exception):
            found = [n for n in _ray().nodes() if n.get("NodeID") == node_id]
            if not found or not found[0].get("Alive"):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def _outcome(data: dict[str, Any], spec: RunSpec, info: dict[str, Any], stopped: bool) -> RunOutcome:
    """The node's outcome with the job; without a shared filesystem its log written here."""
    log_text = data.pop("log_text", None)
    if log_text is not None:
        with contextlib.suppress(OSError):
            spec.log_path.write_text(log_text)
        data.update(log_path=str(spec.log_path), log_tail="\n".join(log_text.splitlines()[-200:]))
    outcome = RunOutcome.model_validate(data)
    update: dict[str, Any] = {"job": info}
    if stopped and (outcome.killed_reason == "stopped" or outcome.signal is not None):
        update["killed_reason"] = "stopped"
    return outcome.model_copy(update=update)


def _kill(name: str) -> None:
    with _live_lock:
        actor = _live.pop(name, None)
    if actor is not None:
        with contextlib.suppress(Exception):
            _ray().kill(actor, no_restart=True)


def _take_all() -> list[Any]:
    """The handles of every actor of this process, no longer killed by :func:`_kill`."""
    with _live_lock:
        taken = list(_live.values())
        _live.clear()
    return taken


def _end_all() -> None:
    """At exit (the night's end, Ctrl-C, SIGTERM): no actor of this process left on the cluster."""
    for name in list(_live):
        _kill(name)


# -- autoloop doctor --executor ray ------------------------------------------------------------------

def cluster_report(address: str | None, gpus: int) -> tuple[bool, list[str]]:
    """Whether a night could run its trials on the cluster, and what doctor says of it: reachable,
    its nodes with their GPUs and CPUs, the Ray version here and on every node (a task pinned on
    each answers). Joins the cluster; starts none (no address: says what a night would do)."""
    ray = _ray()
    here = str(ray.__version__)
    if not (address or os.environ.get("RAY_ADDRESS")):
        return True, [f"ray {here}; no --ray-address and no RAY_ADDRESS: autoloop run starts a local Ray "
                      "cluster on this machine for the night and stops it after"]
    try:
        gcs = connect(address, "autoloop-doctor")
        nodes = alive_nodes()
    except ExecutorError as exc:
        return False, [str(exc)]
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    version = ray.remote(num_cpus=0)(_ray_version)
    try:
        theirs = ray.get([version.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                          .remote() for n in nodes], timeout=120)
    except Exception as exc:  # a node that cannot run a task: said, not a traceback
        theirs = [f"unknown ({_first_line(exc)})"] * len(nodes)
    lines = [f"cluster at {gcs}: {len(nodes)} node(s), "
             f"{sum(n['Resources'].get('GPU', 0) for n in nodes):g} GPU(s), "
             f"{sum(n['Resources'].get('CPU', 0) for n in nodes):g} CPU(s); ray {here} here"]
    for node, version_there in zip(nodes, theirs, strict=True):
        res = node["Resources"]
        lines.append(f"node {node.get('NodeManagerAddress', '?')} ({str(node['NodeID'])[:8]}): "
                     f"{res.get('GPU', 0):g} GPU(s), {res.get('CPU', 0):g} CPU(s), ray {version_there}")
    good = all(v == here for v in theirs)
    if not good:
        lines.append(f"ray differs between here ({here}) and the nodes: install the same version on both")
    try:
        check_fits(nodes, gpus, gcs)
    except ExecutorError as exc:
        good = False
        lines.append(str(exc))
    return good, lines


def _ray_version() -> str:
    import ray

    return str(ray.__version__)
