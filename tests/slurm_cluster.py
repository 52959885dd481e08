"""A private Slurm cluster on this machine, for the tests and benchmarks/engine_overhead.py.

Debian's slurmctld/slurmd/munge packages, started as root with a config and a munge key of
their own under a temporary folder (nothing in /etc is read or written; clients find the
cluster through ``SLURM_CONF``): partition ``debug`` with one node of 2 CPUs and no GPUs
(``urgent`` on the same node preempts it; ``multi`` adds a second node, another slurmd on
this host, for trials that span two nodes), accounting off (so job states come from ``scontrol``, as on clusters without
slurmdbd). Ports are picked free, so two test runs on one machine do not meet.

Partition ``gpu`` is a site's GPU side: two more slurmd, each with GRES ``gpu`` of four stand-in
devices (character-device nodes under the cluster's folder, NVIDIA's major number with no driver
behind it: slurmd only stats them and refuses plain files),
of two models (``a100`` on the first, ``h100`` on the second) and 4 CPUs each (``config_overrides``:
this host has fewer). Slurm binds them as on a real site: a job or step that asks for GPUs gets
``CUDA_VISIBLE_DEVICES`` and ``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS`` of its own, disjoint from any other
job's on the node. The nodes without GPUs (the orchestrator's side) advertise none.

``python tests/slurm_cluster.py`` starts one and prints the ``SLURM_CONF`` to export, for
trying autoloop by hand; Ctrl-C ends it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol", "scancel")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def missing_reason() -> str | None:
    """Why no private cluster can start here, or None."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    missing = [name for name in DAEMONS if shutil.which(name, path=path) is None]
    if missing:
        return (f"Slurm is not installed here ({', '.join(missing)} not found; "
                "apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "the private Slurm cluster starts slurmd as root; run the tests as root (as .ci/run does)"
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


CONF = """\
ClusterName=autoloop-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout=300
SlurmctldTimeout=300
InactiveLimit=0
MinJobAge=600
KillWait=3
OverTimeLimit=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={node_port} CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName={node2} NodeHostname={host} NodeAddr=127.0.0.1 Port={node2_port} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={node} Default=NO MaxTime=INFINITE State=UP PriorityTier=10
PartitionName=multi Nodes={node},{node2} Default=NO MaxTime=INFINITE State=UP PriorityTier=1
NodeName={gpu1} NodeHostname={host} NodeAddr=127.0.0.1 Port={gpu1_port} CPUs=4 RealMemory=4000 Gres=gpu:a100:4
NodeName={gpu2} NodeHostname={host} NodeAddr=127.0.0.1 Port={gpu2_port} CPUs=4 RealMemory=4000 Gres=gpu:h100:4
PartitionName=gpu Nodes={gpu1},{gpu2} Default=NO MaxTime=INFINITE State=UP PriorityTier=1
"""

# Read by slurmd from the folder of slurm.conf. AutoDetect=off: there is no NVML here; the files
# stand in for /dev/nvidia0..3 (Slurm numbers the devices from the digits of the file names).
GRES_CONF = """\
AutoDetect=off
NodeName={gpu1} Name=gpu Type=a100 File={dir}/dev/{gpu1}/nvidia[0-3]
NodeName={gpu2} Name=gpu Type=h100 File={dir}/dev/{gpu2}/nvidia[0-3]
"""

GPU_PARTITION = "gpu"
NVIDIA_MAJOR = 195
GPUS_PER_NODE = 4


class SlurmCluster:
    """Start with :meth:`start`, end with :meth:`stop`; ``env`` is what clients need."""

    def __init__(self, root: Path | None = None):
        self.dir = Path(root or tempfile.mkdtemp(prefix="autoloop-slurm-"))
        self.node = f"al{os.getpid()}"   # unique per run: slurmd's shared memory is keyed by node name
        # A second slurmd on this host (Debian's Slurm runs several, each on a port of its own),
        # only in partition "multi": for trials that span two nodes; the others never land there.
        self.node2 = f"{self.node}b"
        # The GPU nodes: two more slurmd, only in partition "gpu".
        self.gpu_nodes = (f"{self.node}g1", f"{self.node}g2")
        self.conf = self.dir / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def _write(self) -> None:
        nodes = (self.node, self.node2, *self.gpu_nodes)
        for sub in ("munge", "state", *(f"spool/{n}" for n in nodes), *(f"dev/{n}" for n in self.gpu_nodes)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for gpu_node in self.gpu_nodes:
            for i in range(GPUS_PER_NODE):
                os.mknod(self.dir / "dev" / gpu_node / f"nvidia{i}", stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, i))
        # munged refuses a key others can read, and clients must be able to reach its socket.
        self.dir.chmod(0o755)
        (self.dir / "munge").chmod(0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctld_port, slurmd_port, node_port, node2_port, gpu1_port, gpu2_port = _free_ports(6)
        gpu1, gpu2 = self.gpu_nodes
        self.conf.write_text(CONF.format(host=socket.gethostname(), dir=self.dir, node=self.node, node2=self.node2,
                                         ctld_port=ctld_port, slurmd_port=slurmd_port, node_port=node_port,
                                         node2_port=node2_port, gpu1=gpu1, gpu2=gpu2, gpu1_port=gpu1_port,
                                         gpu2_port=gpu2_port))
        (self.dir / "gres.conf").write_text(GRES_CONF.format(dir=self.dir, gpu1=gpu1, gpu2=gpu2))

    def _spawn(self, *argv: str) -> None:
        log = open(self.dir / f"{Path(argv[0]).name}.out", "ab")   # the daemon keeps it open
        env = {**os.environ, **self.env}
        self.procs.append(subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True))

    def start(self, timeout: float = 60) -> SlurmCluster:
        self._write()
        m = self.dir / "munge"
        self._spawn(_tool("munged"), "-F", "-f", f"--socket={m}/munge.socket", f"--key-file={m}/munge.key",
                    f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed")
        _wait(lambda: (m / "munge.socket").exists(), 20, "munged", self.dir)
        # -i: ignore any state left (there is none: the folder is new).
        self._spawn(_tool("slurmctld"), "-D", "-i", "-f", str(self.conf))
        self._spawn(_tool("slurmd"), "-D", "-N", self.node, "-f", str(self.conf))
        for node in (self.node2, *self.gpu_nodes):
            self._spawn(_tool("slurmd"), "-D", "-N", node, "-f", str(self.conf))
        _wait(lambda: self.node_state() == "idle", timeout, "the node to become idle", self.dir)
        return self

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command against this cluster; its stdout."""
        proc = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def node_state(self) -> str:
        with contextlib.suppress(Exception):
            states = set(self.run("sinfo", "-h", "-N", "-o", "%T", check=False).split())
            return states.pop() if len(states) == 1 else ",".join(sorted(states))   # one line per partition
        return ""

    def queue(self) -> list[str]:
        """Job ids still in squeue (pending, running, completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def drain_queue(self, timeout: float = 30) -> None:
        """Cancel whatever a test left and wait for the node to be idle again."""
        ids = self.queue()
        if ids:
            self.run("scancel", *ids, check=False)
        _wait(lambda: not self.queue() and self.node_state() == "idle", timeout, "the queue to drain", self.dir)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.drain_queue(10)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()


def _tool(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
    return found or name


def _wait(ready, timeout: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    logs = "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                   for p in sorted(folder.glob("*.log")) + sorted(folder.glob("*.out")))
    raise RuntimeError(f"private Slurm cluster: timed out waiting for {what} ({timeout:.0f} s){logs}")



# ------------------------------------------------------------------------------ the pytest fixture
def _fixture():
    import pytest

    @pytest.fixture(scope="session")
    def slurm_cluster():
        """One private cluster for the session (the Slurm tests share one xdist group, so one
        worker holds it); skipped only where Slurm is not installed and CI did not ask for it."""
        reason = missing_reason()
        if reason:
            if os.environ.get("AUTOLOOP_REQUIRE_SLURM"):
                pytest.fail(f"AUTOLOOP_REQUIRE_SLURM is set but {reason}")
            pytest.skip(reason)
        cluster = SlurmCluster().start()
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)   # the CLI subprocesses and submitit's sbatch read it
        try:
            yield cluster
        finally:
            cluster.stop()
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            shutil.rmtree(cluster.dir, ignore_errors=True)

    return slurm_cluster


try:
    slurm_cluster = _fixture()
except ImportError:   # run as a script without pytest
    pass

if __name__ == "__main__":
    from helpers.cluster_night import serve_until_signal

    serve_until_signal(lambda: SlurmCluster().start(), lambda cluster: f"export SLURM_CONF={cluster.conf}")
