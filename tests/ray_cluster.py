"""A real multi-node Ray cluster on this machine, for the tests and benchmarks/engine_overhead.py.

A head node without GPUs (where the orchestrator runs, as on a cluster's login or head pod) and
two worker nodes, each declaring four stand-in GPUs (``ray start --num-gpus 4``: Ray binds
them to tasks and actors through ``CUDA_VISIBLE_DEVICES`` as it would real ones). Each node is
its own ``ray start --block`` process, in a session of its own (so that one node, and only that
node, can be killed: :meth:`RayCluster.kill_node`), with its own ``--temp-dir`` and ports picked
free here. The nodes import autoloop from this checkout (PYTHONPATH), as a cluster's image would
carry it.

Ray notices a dead node through missed health checks (by default after about 30 s); the nodes
here check every 0.5 s and give up after 3 misses, so that the lost-node test waits seconds.

``python tests/ray_cluster.py`` starts one and prints the RAY_ADDRESS to export; Ctrl-C ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUS_PER_WORKER = 4
CPUS_PER_WORKER = 4
OBJECT_STORE = str(80 * 1024 * 1024)   # Ray's default is 30% of memory per node: three nodes on a 24 GiB machine
ROOT = Path(__file__).resolve().parents[1]   # this checkout: the nodes import its autoloop
# Each node's worker processes take ports from a range of 100 given here: below the kernel's
# ephemeral range (32768 and up), where the free ports above are picked, which they met once;
# a block of 800 per test process, so that two runs rarely share one, and the ranges handed out
# in this process (every cluster it starts) follow one another.
_worker_ports = iter(range(10000 + (os.getpid() % 27) * 800, 32768, 100))


def missing_reason() -> str | None:
    """Why no Ray cluster can start here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'autoloop[ray]')"
    if shutil.which("ray") is None:
        return "the ray command is not on PATH"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class NodeExited(RuntimeError):
    """A node's ``ray start`` ended while the cluster was starting."""


class RayCluster:
    """Start with :meth:`start`, end with :meth:`stop`; ``address`` is the head's GCS address."""

    def __init__(self, root: Path | None = None, workers: int = 2):
        self.dir = Path(root or tempfile.mkdtemp(prefix="autoloop-ray-"))
        self.workers = workers
        self.procs: dict[str, subprocess.Popen] = {}
        self.address = ""
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path,
                    "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
                    "RAY_health_check_initial_delay_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0",
                    # A ~/.ray/auth_token (left by any `ray.init()` that started a local cluster)
                    # turns token authentication on for a new head, and the tests' clients, which
                    # know no token, could no longer join: this private cluster takes none.
                    "RAY_AUTH_MODE": "disabled"}
        self.env.pop("RAY_ADDRESS", None)

    def _node_args(self, name: str) -> list[str]:
        manager, objects, agent, agent_grpc, runtime_env, metrics = _free_ports(6)
        low = next(_worker_ports)
        return ["--temp-dir", str(self.dir / name), "--node-manager-port", str(manager),
                "--object-manager-port", str(objects), "--dashboard-agent-listen-port", str(agent),
                "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(runtime_env),
                "--metrics-export-port", str(metrics), "--min-worker-port", str(low),
                "--max-worker-port", str(low + 99), "--object-store-memory", OBJECT_STORE,
                "--disable-usage-stats", "--block"]

    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.dir / f"{name}.out", "ab")   # the node keeps it open
        self.procs[name] = subprocess.Popen(["ray", "start", *argv, *self._node_args(name)], stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def start(self, timeout: float = 180, tries: int = 3) -> RayCluster:
        """The head, then the workers; all again (new ports) when a node exits while starting:
        a port picked free here can be taken by another process before the node binds it."""
        for attempt in range(1, tries + 1):
            try:
                return self._start(timeout)
            except NodeExited:
                self.stop()
                if attempt == tries:
                    raise
        return self

    def _start(self, timeout: float) -> RayCluster:
        self.dir.mkdir(parents=True, exist_ok=True)
        (port,) = _free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.start_head(timeout)
        for k in range(1, self.workers + 1):
            self.start_worker(f"worker{k}", wait=False)
        self._wait(lambda: self.gpu_nodes() == self.workers, timeout, f"{self.workers} worker node(s)")
        return self

    def start_head(self, timeout: float = 180) -> None:
        """The head at ``address``: the first, or a new one where the last was lost (a new
        cluster: without GCS fault tolerance it knows nothing of the old one)."""
        port = self.address.rsplit(":", 1)[1]
        self._spawn("head", "--head", "--node-ip-address", "127.0.0.1", "--port", port,
                    "--num-cpus", "1", "--num-gpus", "0", "--include-dashboard", "false")
        self._wait(lambda: self.nodes() is not None, timeout, "the head")

    def start_worker(self, name: str, wait: bool = True, timeout: float = 180) -> None:
        before = self.gpu_nodes() or 0
        self._spawn(name, "--address", self.address, "--node-ip-address", "127.0.0.1",
                    "--num-cpus", str(CPUS_PER_WORKER), "--num-gpus", str(GPUS_PER_WORKER))
        if wait:
            self._wait(lambda: (self.gpu_nodes() or 0) > before, timeout, f"node {name}")

    def nodes(self) -> list[dict] | None:
        """The alive nodes as Ray lists them (NodeID, Resources), or None while the head does not answer."""
        code = (f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); "
                "print(json.dumps([{'NodeID': n['NodeID'], 'Resources': n['Resources']} for n in ray.nodes() "
                "if n['Alive']]))")
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                  env=self.env)
            if proc.returncode == 0:
                return json.loads(proc.stdout.strip().splitlines()[-1])
        return None

    def gpu_nodes(self) -> int | None:
        nodes = self.nodes()
        return None if nodes is None else sum(1 for n in nodes if n["Resources"].get("GPU", 0) > 0)

    def node_of(self, pid: int) -> str | None:
        """The node (its name here) whose session holds ``pid`` or one of its ancestors: a
        trial's process runs in a session of its own, its actor's worker in the node's."""
        import psutil

        leaders = {proc.pid: name for name, proc in self.procs.items() if proc.poll() is None}
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(pid), *psutil.Process(pid).parents()]:
                sid = os.getsid(p.pid)
                if sid in leaders:
                    return leaders[sid]
        return None

    def kill_node(self, name: str) -> None:
        """The node lost at once, as a machine that dies: SIGKILL to its whole session."""
        if name == "head":
            self.leave()
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [name for name, proc in self.procs.items() if proc.poll() is not None]
            if exited:
                raise NodeExited(f"private Ray cluster: node {exited[0]} exited while waiting for {what}"
                                 f"{self._logs()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"private Ray cluster: timed out waiting for {what} ({timeout:.0f} s){self._logs()}")

    def _logs(self) -> str:
        return "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                       for p in sorted(self.dir.glob("*.out")))

    def leave(self) -> None:
        """This process's Ray driver disconnected, where it joined this cluster. A driver is
        attached to the head's raylet (Ray picks the head among a host's nodes): killed under
        it, Ray's core worker ends the whole process, here the pytest worker."""
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized() and str(ray.get_runtime_context().gcs_address).rsplit(":", 1)[1] == \
                    self.address.rsplit(":", 1)[1]:
                ray.shutdown()

    def stop(self) -> None:
        self.leave()
        # Workers first, the head last: a worker outliving its head waits for it in vain.
        for name in sorted(self.procs, key=lambda n: n == "head"):
            proc = self.procs[name]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)   # whatever of its session is left
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.procs.clear()


# ------------------------------------------------------------------------------ the pytest fixture
def require_ray() -> None:
    """Skip the test where Ray cannot run here, or fail it where CI asked for Ray."""
    import pytest

    reason = missing_reason()
    if reason:
        if os.environ.get("AUTOLOOP_REQUIRE_RAY"):
            pytest.fail(f"AUTOLOOP_REQUIRE_RAY is set but {reason}")
        pytest.skip(reason)


def _fixture():
    import pytest

    @pytest.fixture(scope="session")
    def ray_cluster():
        """One cluster for the session (the Ray tests share one xdist group, so one worker
        holds it); skipped only where Ray is not installed and CI did not ask for it."""
        require_ray()
        cluster = RayCluster()
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()   # this process's driver leaves it first (RayCluster.leave)
            shutil.rmtree(cluster.dir, ignore_errors=True)

    return ray_cluster


try:
    ray_cluster = _fixture()
except ImportError:   # run as a script without pytest
    pass

if __name__ == "__main__":
    from helpers.cluster_night import serve_until_signal

    serve_until_signal(lambda: RayCluster().start(), lambda cluster: f"export RAY_ADDRESS={cluster.address}")
