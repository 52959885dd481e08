"""The ``ray`` executor: each trial runs on a node of a Ray cluster, placed by Ray.

Each attempt is one named detached actor (ray_node.TrialRunner) asking Ray for
``gpus_per_trial`` GPUs and a CPU share; Ray binds the GPUs on the node it picks and sets
the actor's ``CUDA_VISIBLE_DEVICES``, which the trial inherits (``places_devices``: the
orchestrator ships no device variables of its own). Detached, in a namespace of the night,
so that a ``kill -9`` of the orchestrator leaves the trial running and ``--resume`` finds it
by name (executors/ray_recovery.py).

A trial over M nodes (``nodes_per_trial``): a placement group of M bundles (N GPUs and the CPU
share each), STRICT_SPREAD so that each lands on a node of its own, and one named detached
actor per bundle, each starting its node's share of the trial (ranks.node_share: torch's
launcher with ``--nnodes M --node-rank k``, meeting at the first node's address on a port free
there). The first node's share is the trial (its log, its result, its nonce); the others' logs
are kept beside it (``<log>.node<k>``, as Slurm's). Any node's actor lost ends every share and
removes the group; the trial is submitted again. No M such nodes in the cluster: refused at
start in one line; a group not placed within ``slurm_pending_timeout``: as a pending job.

The cluster: ``--ray-address`` (else ``RAY_ADDRESS`` of the environment, else a local cluster
started for the night by ``ray.init`` and stopped with it). How the code reaches the node is
chosen at start: a probe task on every node that can take a trial looks for a file written
here into the work tree; where all see it, the filesystem is shared and the trial runs in the
work tree itself; else the worktree goes along in Ray's runtime environment (``working_dir``),
whose size Ray limits (checked at start, one line), uploaded per trial (:func:`ship`). Either
way the outcome and the result's content come back with the actor's answer; without a shared
filesystem the log is read from the actor while the trial runs (appended to the local copy, so
that status, the dashboard and --prune see it grow), the answer bringing the rest.

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
from autoloop.execution.ranks import node_share, node_token
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
WATCH_S = 30.0             # another node's outcome asked this far ahead: its actor's death answers at once
OTHERS_END_S = 10.0        # after the first node's share ended: the others' launchers end by themselves within this
STREAM_CHUNKS = 8          # log chunks (ray_node.LOG_CHUNK each) fetched per poll at most
_live: dict[str, _Held] = {}   # attempt -> its actors and group, of this process: ended at exit whatever happens
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


def check_fits(nodes: list[dict[str, Any]], gpus: int, address: str, count: int = 1, cpus: float = 0.0) -> None:
    """A trial that asks for more than the cluster has would wait for ever: one line now. Over
    ``count`` nodes, ``count`` distinct nodes must each hold ``gpus`` GPUs and ``cpus`` CPUs
    (the placement group is STRICT_SPREAD: one node per bundle)."""
    most = max((int(n["Resources"].get("GPU", 0)) for n in nodes), default=0)
    if gpus > most:
        where = "a trial runs on one node" if count == 1 else "each node of a trial gives it all its GPUs"
        raise ExecutorError(f"--gpus-per-trial {gpus}: no node of the Ray cluster at {address} has {gpus} GPUs "
                            f"(the most on one node: {most}); {where}")
    if count > 1:
        able = [n for n in nodes if n["Resources"].get("GPU", 0) >= gpus and n["Resources"].get("CPU", 0) >= cpus]
        if len(able) < count:
            raise ExecutorError(f"--nodes-per-trial {count}: the Ray cluster at {address} has {len(able)} node(s) "
                                f"of at least {gpus} GPU(s) and {cpus:g} CPU(s), and a trial needs {count} "
                                "distinct ones (one per node)")


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
                 shared: bool | None = None, nodes: int = 1):
        self.namespace = night_namespace(root)
        self.address = connect(address, self.namespace)
        self.head = watch(self.address)   # the night stops, in one line, before Ray would end this process
        alive = alive_nodes()
        self.gpus, self.cpus, self.nodes = gpus, cpu_share(alive, gpus), max(1, nodes)
        check_fits(alive, gpus, self.address, self.nodes, self.cpus)
        self.retries, self.backoff_s, self.poll_s = retries, backoff, poll_s
        self.pending_timeout_s = pending_timeout_s
        if shared is None:
            shared, how = _code_plan(str(Path(root).resolve()), gpus)
        else:
            how = "shared filesystem" if shared else "working_dir (as asked)"
        self.shared = shared
        each = f"asking for {gpus} GPU(s) and {self.cpus:g} CPU(s)"
        shape = (f"one actor {each} on one node" if self.nodes == 1 else
                 f"{self.nodes} actors, one per node (a placement group, STRICT_SPREAD), each {each}, "
                 "torch's launcher on each meeting at the first's")
        self.plan: str | None = f"ray: each trial {shape} of {self.address} ({len(alive)} node(s)); {how}"

    @classmethod
    def from_settings(cls, settings: Settings, root: Path) -> RayExecutor:
        return cls(root, settings.ray_address, settings.gpus_per_trial, retries=settings.slurm_retries,
                   pending_timeout_s=settings.slurm_pending_timeout, nodes=settings.nodes_per_trial)

    def run(self, spec: RunSpec, on_progress: OnProgress | None = None,
            stop_event: threading.Event | None = None, on_start: OnStart | None = None,
            on_job: OnJob | None = None) -> RunOutcome:
        """The trial on the cluster; one whose node died is submitted again (executors/resubmit.py)."""
        return with_resubmission(lambda: self._run_actor(spec, on_progress, stop_event, on_job),
                                 Path(spec.log_path).absolute(), stop_event, self.retries, self.backoff_s)

    def _run_actor(self, spec: RunSpec, on_progress: OnProgress | None, stop_event: threading.Event | None,
                   on_job: OnJob | None) -> RunOutcome:
        spec, token = for_the_node(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        started_at, t0 = time.time(), time.monotonic()
        follower = LogFollower(spec.log_path)
        name = f"{spec.name or 'trial'}-{token[:8]}"
        trial = _Trial(name, self.nodes)
        info: dict[str, Any] = {"executor": "ray", "job_id": name, "address": self.address,
                                "namespace": self.namespace}
        if self.nodes > 1:   # what --resume needs to find every node's actor and the group again
            info.update(actors=trial.names, placement_group=trial.group_name)
        try:
            self._make(trial, spec)
        except Exception as exc:  # Ray refused it (a bad runtime environment): like a launch failure
            _end_trial(trial.name)
            return no_result_outcome(spec, started_at, t0, follower, info,
                                     launch_error=f"Ray refused the trial's actor: {_first_line(exc)}")
        if on_job is not None:
            with contextlib.suppress(Exception):   # recovery is best effort; the trial runs
                on_job({**info, "nonce_sha256": nonce_digest(spec.env.get("AUTOLOOP_NONCE"))})
        try:
            return self._follow(trial, spec, token, info, started_at, t0, follower, on_progress, stop_event)
        except Exception as exc:
            gone = exc if isinstance(exc, HeadGone) else self.head.failed_without()
            if gone is None:
                raise
            leave(_take_all())   # no Ray call below may wait on the dead head
            raise gone from None
        finally:
            _end_trial(trial.name)

    def _make(self, trial: _Trial, spec: RunSpec) -> None:
        """The attempt's actors (and, over several nodes, their placement group), registered
        as they are made so that whatever was made is ended whatever happens next."""
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from autoloop.execution.executors.ray_node import TrialRunner

        options: dict[str, Any] = {"namespace": self.namespace, "lifetime": "detached", "num_gpus": self.gpus,
                                   "num_cpus": self.cpus, "max_restarts": 0, "max_concurrency": 4}
        if not self.shared:
            options["runtime_env"] = {"working_dir": ship(Path(spec.cwd))}
        runner = ray.remote(TrialRunner)
        group: Any = None
        if self.nodes > 1:
            bundle = {"CPU": self.cpus, **({"GPU": float(self.gpus)} if self.gpus else {})}
            # STRICT_SPREAD: each bundle on a node of its own, or none placed. The trial's
            # launchers are one per node (torchrun --nnodes M, a node rank each); two bundles on
            # one node would run two launchers there, and SPREAD only tries to spread. Detached:
            # a group dies with its creator otherwise, and with it the actors in it, where a
            # kill -9 of the orchestrator must leave the trial running for --resume.
            group = ray.util.placement_group([dict(bundle) for _ in range(self.nodes)], strategy="STRICT_SPREAD",
                                             name=trial.group_name, lifetime="detached")
            _register(trial.name, group=group)
        for k, actor_name in enumerate(trial.names):
            if self.nodes > 1:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=k, placement_group_capture_child_tasks=False)
            _register(trial.name, actor=runner.options(name=actor_name, **options).remote())
        trial.actors = list(_live[trial.name].actors)

    def _follow(self, trial: _Trial, spec: RunSpec, token: str, info: dict[str, Any], started_at: float,
                t0: float, follower: LogFollower, on_progress: OnProgress | None,
                stop_event: threading.Event | None) -> RunOutcome:
        ray = _ray()
        first = trial.actors[0]
        placed = [actor.where.remote() for actor in trial.actors]
        wheres: list[dict[str, Any]] | None = None
        watches: dict[int, Any] = {}   # node k's outcome, asked ahead: an error as soon as its actor dies
        stopped, data, streamed = False, None, 0
        try:
            while data is None:
                self.head.check()
                if stop_event is not None and stop_event.is_set() and not stopped:
                    stopped = True
                    if wheres is None:   # not placed yet: nothing runs, nothing to wait for
                        return no_result_outcome(spec, started_at, t0, follower, info, stopped=True,
                                                 note=f"ray actor {info['job_id']} stopped before Ray placed it")
                    for actor in trial.actors:
                        actor.stop.remote()
                    stop_deadline = time.monotonic() + spec.grace_s + STOP_WAIT_S
                if wheres is None:
                    ready, _ = ray.wait(placed, num_returns=len(placed), timeout=self.poll_s)
                    if len(ready) == len(placed):
                        wheres = ray.get(placed)
                        info.update(_placement(wheres))
                        self._start(trial, spec, wheres)
                        watches = {k: a.outcome.remote(WATCH_S) for k, a in enumerate(trial.actors) if k}
                    elif self._pending_too_long(t0):
                        info["job_state"] = "PENDING_LIMIT"
                        waited = "its placement group" if self.nodes > 1 else f"ray actor {info['job_id']}"
                        why = (f"{waited} not placed after {format_duration(self.pending_timeout_s or 0)} "
                               "(slurm_pending_timeout): killed")
                        return no_result_outcome(spec, started_at, t0, follower, info, job_error=why, note=why)
                    continue
                _check_watches(ray, trial, watches)
                with contextlib.suppress(ray.exceptions.GetTimeoutError):   # a slow answer: ask again
                    data = ray.get(first.outcome.remote(self.poll_s, None if self.shared else streamed),
                                   timeout=self.poll_s + 120)
                if data is None and not self.shared:
                    streamed += _stream(ray, first, spec.log_path, streamed)
                follower.poll(on_progress)
                if data is None and stopped and time.monotonic() > stop_deadline:
                    break
        except ray.exceptions.RayActorError as exc:
            return self._lost(exc, trial, spec, token, info, wheres, started_at, t0, follower, stopped)
        except ray.exceptions.RayError as exc:   # Ray could not run it (its runtime environment, a start not answered)
            error = f"ray actor {info['job_id']}: {_first_line(exc)}"
            return no_result_outcome(spec, started_at, t0, follower, info, stopped=stopped,
                                     job_error=None if stopped else error, note=error)
        lost = self._end_others(trial, spec, wheres or [], stopped)
        if lost is not None and not _finished(data):
            # Another node's actor died under the trial: rank 0's failure is the lost node's doing.
            return self._lost(lost, trial, spec, token, info, wheres, started_at, t0, follower, stopped)
        if not isinstance(data, dict) or "node_error" in data:
            what = data.get("node_error") if isinstance(data, dict) else "no outcome in time after the stop"
            error = f"ray actor {info['job_id']} gave no trial outcome: {what}"
            return no_result_outcome(spec, started_at, t0, follower, info, stopped=stopped,
                                     job_error=None if stopped else error, note=error)
        return _outcome(data, spec, info, stopped, streamed)

    def _start(self, trial: _Trial, spec: RunSpec, wheres: list[dict[str, Any]]) -> None:
        """Each actor starts its node's share: the trial itself on one node; over several, the
        launchers meet at the first node's address on a port free there (asked of it)."""
        ray = _ray()
        shares = [spec]
        if self.nodes > 1:
            port = int(ray.get(trial.actors[0].free_port.remote(), timeout=120))
            address = str(wheres[0].get("node_ip") or wheres[0].get("host"))
            shares = [node_share(spec, self.nodes, k, address, port) for k in range(self.nodes)]
        ray.get([actor.start.remote(share.model_dump_json(), not self.shared)
                 for actor, share in zip(trial.actors, shares, strict=True)], timeout=300)

    def _end_others(self, trial: _Trial, spec: RunSpec, wheres: list[dict[str, Any]],
                    stopped: bool) -> BaseException | None:
        """The first node's share has ended: the others end with it (a short wait, then their
        trees are stopped), their logs kept beside the trial's (``.node<k>``, as Slurm's). The
        error of an actor that died meanwhile, if one did."""
        if len(trial.actors) < 2 or not wheres:
            return None
        ray = _ray()
        lost: BaseException | None = None
        others = list(enumerate(trial.actors))[1:]
        answers: dict[int, Any] = {}
        for wait_s, stop in ((0.0 if stopped else OTHERS_END_S, False), (spec.grace_s + STOP_WAIT_S, True)):
            pending = [(k, a) for k, a in others if k not in answers]
            if not pending:
                break
            if stop:
                for _, actor in pending:
                    with contextlib.suppress(Exception):
                        actor.stop.remote()
            refs = {k: a.outcome.remote(wait_s) for k, a in pending}
            for k, ref in refs.items():
                try:
                    data = ray.get(ref, timeout=wait_s + 120)
                except ray.exceptions.RayActorError as exc:
                    lost = lost or exc
                    answers[k] = None
                    continue
                except Exception:  # no answer in time: stopped below, then killed with the rest
                    continue
                if data is not None:
                    answers[k] = data
        for k, data in answers.items():
            if isinstance(data, dict) and data.get("log_text") is not None:
                log = Path(spec.log_path)
                with contextlib.suppress(OSError):
                    log.with_name(f"{log.stem}.node{k}{log.suffix}").write_text(data["log_text"])
        return lost

    def _pending_too_long(self, t0: float) -> bool:
        return self.pending_timeout_s is not None and time.monotonic() - t0 > self.pending_timeout_s

    def _lost(self, exc: BaseException, trial: _Trial, spec: RunSpec, token: str, info: dict[str, Any],
              wheres: list[dict[str, Any]] | None, started_at: float, t0: float, follower: LogFollower,
              stopped: bool) -> RunOutcome:
        """An actor died under the trial: its node died (the cluster's doing: submitted
        again), or the actor's process did (said as the job's error). Every other node's
        share is ended first: one node's loss ends the trial."""
        said = _first_line(exc)
        dead = _dead_node(wheres or [], self.head.check)
        if len(trial.actors) > 1:
            self._end_others_now(trial, spec)
        state = "NODE_DIED" if dead is not None else "ACTOR_DIED"
        info.update({"job_state": f"{state} ({said})", "ray_reason": said})
        # Where the node shared this host (a workstation, the tests' cluster), the trial's
        # processes outlive its dead actor: ended by their token. A lost machine took them along.
        strays = sum(end_token_holders(node_token(token, k)) for k in range(len(trial.actors)))
        node = (wheres or [{}])[dead or 0].get("node_ip") or info.get("node", "?")
        error = (f"ray actor {trial.names[dead]} lost its node {node}: {said}" if dead is not None
                 else f"ray actor {info['job_id']} died: {said}")
        if strays:
            error += f" (ended {strays} trial process(es) it left on this machine)"
        return no_result_outcome(spec, started_at, t0, follower, info, stopped=stopped,
                                 job_error=None if stopped else error, note=error)

    def _end_others_now(self, trial: _Trial, spec: RunSpec) -> None:
        """Stop every share still running (their trees ended by their runners), bounded."""
        ray = _ray()
        for actor in trial.actors:
            with contextlib.suppress(Exception):
                actor.stop.remote()
        refs = [actor.outcome.remote(spec.grace_s + STOP_WAIT_S) for actor in trial.actors]
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=spec.grace_s + STOP_WAIT_S + 30)


class _Trial:
    """One attempt's actors on the cluster: the first's name is the job's id; over several
    nodes, one actor per node (``<name>-n<k>``) and their placement group (``<name>-pg``)."""

    def __init__(self, name: str, nodes: int):
        self.name = name
        self.names = [name] + [f"{name}-n{k}" for k in range(1, nodes)]
        self.group_name = f"{name}-pg" if nodes > 1 else None
        self.actors: list[Any] = []


class _Held:
    """What this process holds on the cluster for one attempt, ended at its end or at exit."""

    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.group: Any = None


def _register(name: str, actor: Any = None, group: Any = None) -> None:
    with _live_lock:
        held = _live.setdefault(name, _Held())
        if actor is not None:
            held.actors.append(actor)
        if group is not None:
            held.group = group


def _check_watches(ray: Any, trial: _Trial, watches: dict[int, Any]) -> None:
    """Raise the RayActorError of another node's actor that died (its node lost, most likely);
    a watch that answered (the share ended, or its wait ran out) is asked again while the
    share runs."""
    if not watches:
        return
    ready, _ = ray.wait(list(watches.values()), num_returns=len(watches), timeout=0)
    for k, ref in list(watches.items()):
        if ref in ready:
            data = ray.get(ref)   # RayActorError: the node's actor is gone
            if data is None:
                watches[k] = trial.actors[k].outcome.remote(WATCH_S)
            else:
                del watches[k]


def _stream(ray: Any, actor: Any, log_path: Path, offset: int) -> int:
    """Append what the node's log gained since ``offset`` to the local log; bytes added. A few
    chunks a poll at most, so that a trial printing floods cannot hold the loop."""
    added = 0
    for _ in range(STREAM_CHUNKS):
        try:
            chunk = ray.get(actor.log_since.remote(offset + added), timeout=120)
        except ray.exceptions.GetTimeoutError:
            break
        if not chunk:
            break
        with open(log_path, "ab" if offset + added else "wb") as f:   # a log left at this path is not this trial's
            f.write(chunk)
        added += len(chunk)
    return added


def _finished(data: Any) -> bool:
    """Whether the first node's outcome is a trial that ended by itself with a result."""
    return isinstance(data, dict) and data.get("exit_code") == 0 and data.get("metric") is not None


def _placement(wheres: list[dict[str, Any]]) -> dict[str, Any]:
    """For the ledger record's extra: the trial's node and the GPU ids Ray bound to it (the
    first node's), and every node with its GPU ids."""
    each = [{"node": w.get("node_ip") or w.get("host"), "node_id": w.get("node_id"), "gpu_ids": w.get("gpu_ids") or [],
             "cuda_visible_devices": w.get("cuda_visible_devices", "")} for w in wheres]
    return {**each[0], "nodes": each}


def _dead_node(wheres: list[dict[str, Any]], check_head: Callable[[], None],
               wait_s: float = NODE_DEATH_WAIT_S) -> int | None:
    """Which of the trial's nodes the cluster marks dead (its index), waiting for the health
    checks to say so (the head checked meanwhile: a node lost with it is not waited for); None
    when all stay alive."""
    ids = [w.get("node_id") for w in wheres]
    if not any(ids):
        return None
    deadline = time.monotonic() + wait_s
    while True:
        check_head()
        with contextlib.suppress(Exception):
            alive = {n.get("NodeID") for n in _ray().nodes() if n.get("Alive")}
            dead = [k for k, node_id in enumerate(ids) if node_id and node_id not in alive]
            if dead:
                return dead[0]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def _outcome(data: dict[str, Any], spec: RunSpec, info: dict[str, Any], stopped: bool,
             streamed: int = 0) -> RunOutcome:
    """The node's outcome with the job; without a shared filesystem its log completed here
    (the rest after the ``streamed`` bytes already here, or the whole when the node rewrote it)."""
    log_text = data.pop("log_text", None)
    log_rest = data.pop("log_rest", None)
    if log_text is not None or log_rest is not None:
        with contextlib.suppress(OSError):
            if log_rest is not None:
                with open(spec.log_path, "ab" if streamed else "wb") as f:
                    f.write(log_rest)
            else:
                spec.log_path.write_text(log_text or "")
        text = spec.log_path.read_text(errors="replace") if spec.log_path.exists() else (log_text or "")
        data.update(log_path=str(spec.log_path), log_tail="\n".join(text.splitlines()[-200:]))
    outcome = RunOutcome.model_validate(data)
    update: dict[str, Any] = {"job": info}
    if stopped and (outcome.killed_reason == "stopped" or outcome.signal is not None):
        update["killed_reason"] = "stopped"
    return outcome.model_copy(update=update)


def _end_trial(name: str) -> None:
    """The attempt's actors killed and its placement group removed (which also ends whatever
    of it was still being placed)."""
    with _live_lock:
        held = _live.pop(name, None)
    if held is None:
        return
    ray = _ray()
    for actor in held.actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    if held.group is not None:
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(held.group)


def _take_all() -> list[Any]:
    """The handles of every actor of this process, no longer ended by :func:`_end_trial`."""
    with _live_lock:
        taken = [actor for held in _live.values() for actor in held.actors]
        _live.clear()
    return taken


def _end_all() -> None:
    """At exit (the night's end, Ctrl-C, SIGTERM): no actor or placement group of this process
    left on the cluster."""
    for name in list(_live):
        _end_trial(name)


# -- autoloop doctor --executor ray ------------------------------------------------------------------

def cluster_report(address: str | None, gpus: int, count: int = 1) -> tuple[bool, list[str]]:
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
        check_fits(nodes, gpus, gcs, count, cpu_share(nodes, gpus) if nodes else 0.0)
    except ExecutorError as exc:
        good = False
        lines.append(str(exc))
    return good, lines


def _ray_version() -> str:
    import ray

    return str(ray.__version__)
