"""The ray executor against a real multi-node Ray cluster on this machine (tests/ray_cluster.py:
a head without GPUs where the orchestrator runs, two worker nodes of four stand-in GPUs each,
separate processes with their own temp dirs and ports). Actors are real, GPU binding is Ray's,
the orchestrator and a node are killed for real.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.cluster_night import fake_train, hang_train, releasable_train, start_autoloop, wait_for
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, queue_file
from ray_cluster import ray_cluster  # noqa: F401 - the session fixture

from autoloop.core.classify import classify

pytest.importorskip("ray")

# One cluster serves them all: with `-n 2 --dist loadgroup` they run on one worker.
pytestmark = pytest.mark.xdist_group("ray_cluster")


def night(*extra: str) -> list[str]:
    return ["run", "--budget", "2", "--timeout", "60", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--executor", "ray", "--noise-runs", "0",
            "--sanity-bound", "0", *extra]


def start_night(repo: Path, data_dir: Path, *args: str) -> subprocess.Popen:
    return start_autoloop(repo, data_dir, list(args))


def live_actors(address: str) -> list[str]:
    """The names of the trial actors the cluster holds, not dead (the GCS's actor table: the state
    API needs the dashboard, which the test cluster leaves out). The tests run one at a time on
    this cluster, so any is one a test left."""
    import ray
    from ray._private import state

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return [a["Name"] for a in state.actors().values()
            if a["ActorClassName"].endswith("TrialRunner") and a["State"] != "DEAD"]


def live_groups(address: str) -> list[str]:
    """The names of the placement groups the cluster holds, not removed (the GCS's table)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


@pytest.fixture
def cluster(ray_cluster, monkeypatch):  # noqa: F811
    """The session's cluster, named by RAY_ADDRESS for the CLI subprocesses and this process."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    return ray_cluster


GPU_LINE = re.compile(r"^rank (\d)/(\d) cuda (\S+)$", re.MULTILINE)


def gpu_train(value: float, barrier: Path | None = None) -> str:
    """Each rank says which devices it sees; rank 0 reports ``value``. With ``barrier``, rank 0
    waits (bounded) until two trials run at once, so that the GPUs they hold are held together."""
    wait = "" if barrier is None else (
        f"    barrier = pathlib.Path({str(barrier)!r})\n"
        "    (barrier / str(os.getpid())).write_text('x')\n"
        "    deadline = time.monotonic() + 90\n"
        "    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:\n"
        "        time.sleep(0.2)\n")
    return (f"import os, pathlib, time\nVALUE = {value!r}\nenv = os.environ\n"
            "cuda = env.get('CUDA_VISIBLE_DEVICES')\n"
            "os.write(1, f\"rank {env['RANK']}/{env['WORLD_SIZE']} cuda {cuda}\\n\".encode())\n"
            "if env['RANK'] == '0':\n" + wait + "    os.write(1, f'---\\nval_bpb: {VALUE:.6f}\\n'.encode())\n")


def test_each_trial_gets_two_gpus_ray_bound_disjoint_from_the_others(tmp_path, tiny_data_dir, cluster):
    """The orchestrator on the head (no GPUs), the trials on the worker nodes: each trial's two
    ranks see the two GPUs Ray bound to its actor (no device variable from here), recorded with
    its node; two trials at once hold disjoint GPUs."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    repo = init_repo(tmp_path / "repo", {"train.py": gpu_train(1.0)})
    queue_file(repo, "01_a.py", gpu_train(0.9, barrier), "a")
    queue_file(repo, "02_b.py", gpu_train(0.95, barrier), "b")
    proc = autoloop(repo, "run", "--budget", "2", "--timeout", "90", "--proposer", "queue", "--tag", "t",
                    "--command", f"{sys.executable} train.py", "--executor", "ray", "--workers", "2",
                    "--gpus-per-trial", "2", "--max-trials", "2", data_dir=tiny_data_dir,
                    env={"AUTOLOOP_DEVICE": ""}, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "each on what ray binds to its job on its node" in proc.stdout, proc.stdout
    assert "asking for 2 GPU(s) and 2 CPU(s)" in proc.stdout and "the nodes share this filesystem" in proc.stdout
    ledger = assert_invariants(repo)
    assert sorted(r["description"] for r in ledger) == ["a", "b", "baseline"], ledger
    gpu_nodes = {n["NodeID"] for n in cluster.nodes() or [] if n["Resources"].get("GPU")}
    held: dict[str, set[tuple[str, str]]] = {}
    for record in ledger:
        assert record["status"] in ("keep", "discard"), record
        log = (repo / "results" / record["log_path"]).read_text()
        ranks = GPU_LINE.findall(log)
        assert sorted(r[:2] for r in ranks) == [("0", "2"), ("1", "2")], log   # two ranks, launched by torch
        assert len({r[2] for r in ranks}) == 1, ranks   # both see the same devices
        extra = record["extra"]
        gpus = ranks[0][2].split(",")
        assert len(gpus) == 2 and gpus == extra["gpu_ids"] and extra["executor"] == "ray", (ranks, extra)
        assert extra["node_id"] in gpu_nodes, extra   # a worker node, never the head
        held[record["description"]] = {(extra["node_id"], gpu) for gpu in gpus}
    assert len(list(barrier.iterdir())) == 2   # the two trials ran at once
    assert not held["a"] & held["b"], held
    assert not live_actors(cluster.address)


def test_more_gpus_per_trial_than_any_node_has_is_one_line(tmp_path, tiny_data_dir, cluster):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    proc = autoloop(repo, *night("--gpus-per-trial", "8"), data_dir=tiny_data_dir, env={"AUTOLOOP_DEVICE": ""})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    port = cluster.address.rsplit(":", 1)[1]   # Ray names the head by its node address, not 127.0.0.1
    said = f":{port} has 8 GPUs (the most on one node: 4); a trial runs on one node"
    assert said in proc.stderr and "--gpus-per-trial 8: no node of the Ray cluster at " in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()


def test_doctor_lists_the_clusters_nodes_gpus_cpus_and_ray_versions(tmp_path, tiny_data_dir, cluster):
    import ray

    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    proc = autoloop(repo, "doctor", "--executor", "ray", "--gpus-per-trial", "2", data_dir=tiny_data_dir)
    said = [line for line in proc.stdout.splitlines() if " ray " in f" {line} "]
    port = cluster.address.rsplit(":", 1)[1]
    assert any(f":{port}: 3 node(s), 8 GPU(s), 9 CPU(s); ray {ray.__version__} here" in x for x in said), proc.stdout
    nodes = [x for x in said if " node " in x and f"ray {ray.__version__}" in x]
    assert sorted(re.search(r"\): (.*), ray ", x).group(1) for x in nodes if "): " in x) == \
        ["0 GPU(s), 1 CPU(s)", "4 GPU(s), 4 CPU(s)", "4 GPU(s), 4 CPU(s)"], proc.stdout
    proc = autoloop(repo, "doctor", "--executor", "ray", "--gpus-per-trial", "8", data_dir=tiny_data_dir)
    assert proc.returncode != 0 and "no node of the Ray cluster at " in proc.stdout, proc.stdout


def executor_run(tmp_path: Path, script: str, timeout_s: float = 120, retries: int = 3, shared: bool | None = None,
                 nodes: int = 1, heard: list | None = None):
    """Run one trial through RayExecutor in a thread; (thread, result holder, jobs, executor).
    ``heard``: the progress lines the executor reports are appended to it."""
    from autoloop.execution.executors.ray_executor import RayExecutor
    from autoloop.execution.runner import RunSpec

    work = tmp_path / "ws"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(script)
    spec = RunSpec(command=[sys.executable, "train.py"], cwd=work, log_path=tmp_path / "runs" / "1-1.log",
                   budget_s=1, timeout_s=timeout_s, sample_interval_s=0.05, grace_s=2)
    executor = RayExecutor(work, gpus=1, retries=retries, poll_s=0.2, shared=shared, nodes=nodes,
                           backoff=0.1)   # the waits between resubmissions: not this test's subject
    jobs: list[dict] = []
    result: list = []
    on_progress = heard.append if heard is not None else None
    thread = threading.Thread(target=lambda: result.append(executor.run(spec, on_job=jobs.append,
                                                                        on_progress=on_progress)), daemon=True)
    thread.start()
    return thread, result, jobs, executor


def test_the_hard_timeout_ends_the_trial_on_its_node(tmp_path, cluster):
    marker = tmp_path / "started"
    thread, result, jobs, executor = executor_run(tmp_path, hang_train(marker), timeout_s=3)
    thread.join(120)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.timed_out and outcome.killed_reason == "timeout", outcome
    assert classify(outcome).kind == "timeout"
    assert outcome.job["gpu_ids"] and outcome.job["node_id"], outcome.job
    assert not alive(int(marker.read_text())), "the trial outlived its timeout"
    assert not live_actors(cluster.address)


def test_without_a_shared_filesystem_the_work_tree_travels_and_the_log_comes_back(tmp_path, cluster):
    """The working_dir way (chosen where a node does not see the work tree; asked for here, as
    every node of this cluster sees it): the trial runs in the copy Ray unpacked on the node, its
    log is read from the actor while it trains (the local copy grows, progress is reported), and
    the rest and its result come back in the actor's answer. The stand-in waits for a file only
    this test writes (the nodes share this host's files, though the executor does not use that)."""
    release = tmp_path / "release"
    progress = "step 00001 (1.0%) | loss: 9.0"
    script = fake_train(0.7, "import os, pathlib, time\nprint('cwd ' + os.getcwd(), flush=True)\n"
                             f"print({progress!r}, flush=True)\n"
                             f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)\n")
    heard: list[str] = []
    thread, result, jobs, executor = executor_run(tmp_path, script, shared=False, heard=heard)
    log_path = tmp_path / "runs" / "1-1.log"
    try:
        wait_for("the progress line in the local log", lambda: log_path.exists() and progress in log_path.read_text())
        assert not result and thread.is_alive(), "the trial ended before its release"   # streamed while it ran
        wait_for("the progress reported", lambda: heard)
        assert heard[-1] == progress, heard
    finally:
        release.write_text("go")
    thread.join(180)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.metric == 0.7 and classify(outcome).kind == "ok", (outcome.launch_error, outcome.log_tail)
    log = log_path.read_text()
    ran_in = re.search(r"^cwd (\S+)$", log, re.MULTILINE)
    assert ran_in and "runtime_resources" in ran_in.group(1) and ran_in.group(1) != str(tmp_path / "ws"), log
    assert log.count(progress) == 1 and log.count("val_bpb: 0.700000") == 1, log   # the rest added once
    assert outcome.log_path == log_path and "val_bpb: 0.700000" in outcome.log_tail
    assert not live_actors(cluster.address)


def counting_train(runs: Path, marker: Path, hang_runs: int) -> str:
    """Counts its runs in ``runs`` (one x each); the first ``hang_runs`` of them write their pid to
    ``marker`` and hang."""
    return fake_train(0.8, f"import os, pathlib, time\np = pathlib.Path({str(runs)!r})\n"
                           "n = len(p.read_text()) if p.exists() else 0\np.write_text('x' * (n + 1))\n"
                           f"if n < {hang_runs}:\n"
                           f"    pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\n"
                           "    time.sleep(300)\n")


def test_a_node_lost_mid_trial_is_the_clusters_doing_and_the_trial_runs_again(tmp_path, cluster):
    """Its node killed at once (the whole node, as a machine that dies): Ray's reason in the
    record, the trial submitted again on the other node and counted apart, nothing left running."""
    runs, marker = tmp_path / "runs.txt", tmp_path / "started"
    thread, result, jobs, executor = executor_run(tmp_path, counting_train(runs, marker, 1))
    wait_for("the trial to run", marker.exists)
    pid = int(marker.read_text())
    node = cluster.node_of(pid)
    assert node and node.startswith("worker"), node
    cluster.kill_node(node)
    try:
        thread.join(180)
        assert result, "the executor never returned"
        outcome = result[0]
        assert outcome.metric == 0.8 and classify(outcome).kind == "ok", outcome
        resubmitted = outcome.job.get("resubmitted") or []
        assert len(resubmitted) == 1 and "NODE_DIED" in resubmitted[0], outcome.job
        assert resubmitted[0].startswith(f"job {jobs[0]['job_id']}: NODE_DIED ("), resubmitted
        first_log = outcome.log_path.with_name(f"1-1.job-{jobs[0]['job_id']}.log").read_text()
        assert "lost its node" in first_log and "submitted again" in first_log, first_log
        assert len(jobs) == 2 and runs.read_text() == "xx"
        assert not alive(pid), "the lost node's trial was left running"
        assert not live_actors(cluster.address)
    finally:
        cluster.start_worker(node)   # the session's cluster whole again for the next tests


@pytest.mark.parametrize(("how", "nodes"), [("ctrl-c", 1), ("sigterm", 2)])
def test_a_stop_ends_the_trial_and_its_actor(tmp_path, tiny_data_dir, cluster, how, nodes):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the orchestrator alone: the
    trial's tree ended on its node (over two nodes: on each), its actors killed (and their
    placement group removed), the attempt recorded interrupted."""
    pids = tmp_path / "pids"
    pids.mkdir()
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    marker = pids / "0"
    hangs = hang_train(marker) if nodes == 1 else two_node_hang_train(tmp_path / "attempts", pids)
    queue_file(repo, "01_hang.py", hangs, "hangs")
    orchestrator = start_night(repo, tiny_data_dir, *night("--gpus-per-trial", "1", "--nodes-per-trial", str(nodes)))
    try:
        wait_for("the hanging trial to run",
                 lambda: len(list(pids.iterdir())) == nodes or orchestrator.poll() is not None)
        assert len(list(pids.iterdir())) == nodes, orchestrator.communicate()[0]
        assert len(live_actors(cluster.address)) == nodes
        if how == "ctrl-c":
            os.killpg(orchestrator.pid, signal.SIGINT)   # as a terminal's Ctrl-C does
        else:
            os.kill(orchestrator.pid, signal.SIGTERM)   # the orchestrator alone, as `kill` sends it
        out, _ = orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    name = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    assert orchestrator.returncode == (130 if how == "ctrl-c" else 143), out
    hung = [r for r in assert_invariants(repo) if r["description"] == "hangs"]
    assert hung and hung[0]["reason"] == f"interrupted ({name})", hung
    assert not any(alive(int(p.read_text())) for p in pids.iterdir()), out
    assert not live_actors(cluster.address) and not live_groups(cluster.address), out


def kill_9_while_running(repo: Path, data_dir: Path, started: Path, nodes: int = 1) -> dict:
    """Start a night, kill -9 it once its trial runs (over ``nodes`` nodes: once each node's rank
    marked ``started``, a folder); the job recorded in state.json."""
    orchestrator = start_night(repo, data_dir, *night("--gpus-per-trial", "1", "--nodes-per-trial", str(nodes)))

    def running() -> bool:
        return len(list(started.iterdir())) == nodes if nodes > 1 else started.exists()

    try:
        wait_for("the trial to run", lambda: running() or orchestrator.poll() is not None)
        assert running(), orchestrator.communicate()[0]
        job = json.loads((repo / "results" / "state.json").read_text())["job"]
        os.killpg(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait(30)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    return job


def resume_in_background(repo: Path, data_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``autoloop run --resume`` with its output in ``out``, read while it runs."""
    return start_autoloop(repo, data_dir, night("--gpus-per-trial", "1", "--resume", *extra), out)


def ranks_releasable_train(value: float, started: Path, release: Path) -> str:
    """releasable_train for a trial over several nodes: each rank marks ``started/<rank>``, waits
    for ``release``, then writes its node's result file (the first node's is the trial's)."""
    return fake_train(value, f"import json, os, pathlib, time\n"
                             f"pathlib.Path({str(started)!r}, os.environ['RANK']).write_text('x')\n"
                             f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)\n"
                             "pathlib.Path(os.environ['AUTOLOOP_RESULT']).write_text(json.dumps("
                             "{'val_bpb': VALUE, 'nonce': os.environ['AUTOLOOP_NONCE']}))\n")


@pytest.mark.parametrize("nodes", [1, 2])
def test_resume_after_kill_9_reattaches_to_the_running_actor_and_takes_its_result(tmp_path, tiny_data_dir, cluster,
                                                                                  nodes):
    """The orchestrator killed with -9 while its trial runs: the detached actor runs on (over two
    nodes: both actors and their placement group), --resume waits for it (not cancelled), takes
    its result with the nonce recorded at submission, and leaves no actor and no group."""
    started, release, out = tmp_path / "started", tmp_path / "release", tmp_path / "resume.out"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    if nodes > 1:
        started.mkdir()
    script = releasable_train(0.9, started, release) if nodes == 1 else ranks_releasable_train(0.9, started, release)
    queue_file(repo, "01_waits.py", script, "waits")
    job = kill_9_while_running(repo, tiny_data_dir, started, nodes)
    assert job["executor"] == "ray" and job["nonce_sha256"], job
    actors = job.get("actors") or [job["job_id"]]
    assert len(actors) == nodes and actors[0] == job["job_id"], job
    assert sorted(live_actors(cluster.address)) == sorted(actors)   # the trial runs on without its orchestrator
    if nodes > 1:
        assert job["placement_group"] in live_groups(cluster.address), job
    resumed = resume_in_background(repo, tiny_data_dir, out, "--nodes-per-trial", str(nodes))
    try:
        wait_for("the resume to re-attach", lambda: "re-attached" in out.read_text() or resumed.poll() is not None)
        assert f"recovery: trial 1.1: re-attached to ray actor {job['job_id']}" in out.read_text(), out.read_text()
        assert sorted(live_actors(cluster.address)) == sorted(actors)   # waited for, not cancelled
        release.write_text("go")   # the trial ends while the resumed night waits for it
        assert resumed.wait(120) == 0, out.read_text()
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    said = out.read_text()
    assert f"its job {job['job_id']} finished meanwhile; its result taken (keep" in said, said
    assert "cancelled" not in said, said
    waited = [r for r in assert_invariants(repo) if r["description"] == "waits"]
    assert len(waited) == 1 and waited[0]["metric"] == 0.9 and waited[0]["extra"]["collected"], waited
    assert waited[0]["extra"]["job_id"] == job["job_id"]
    assert not live_actors(cluster.address) and not live_groups(cluster.address)


def test_resume_does_not_trust_a_finished_actors_result_with_another_nonce(tmp_path, tiny_data_dir, cluster):
    """The trial finished before --resume, its result carrying a forged nonce: recorded
    interrupted, not taken; its actor ended all the same."""
    started, release = tmp_path / "started", tmp_path / "release"
    forged = releasable_train(0.5, started, release, "'0' * 16")
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_forged.py", forged, "forged")
    job = kill_9_while_running(repo, tiny_data_dir, started)
    assert live_actors(cluster.address) == [job["job_id"]]   # (and this process joined the cluster)
    release.write_text("go")
    import ray

    actor = ray.get_actor(job["job_id"], namespace=job["namespace"])
    wait_for("the trial to finish", lambda: ray.get(actor.outcome.remote(0.5)) is not None)
    proc = autoloop(repo, *night("--gpus-per-trial", "1", "--resume", "--no-rerun-interrupted"),
                    data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "its result taken" not in proc.stdout, proc.stdout
    forged_records = [r for r in assert_invariants(repo) if r["description"] == "forged"]
    assert forged_records[0]["status"] == "crash" and forged_records[0]["reason"].startswith("interrupted"), \
        forged_records
    assert not live_actors(cluster.address)


# Each rank adds its rank + 1 over gloo (1 + 2 + 3 + 4 = 10 for four ranks: the metric is 1.0 only
# when all four joined); rank 0 prints every rank's line: its rank, the world, the session ids of
# its process and its ancestors (the test finds the Ray node among them) and its devices.
TWO_NODE_TRAIN = '''\
import os
import torch
import torch.distributed as dist


def sessions():
    found, pid = [], os.getpid()
    while pid > 1:
        found.append(os.getsid(pid))
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return ",".join(map(str, found))


dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
lines = [None] * dist.get_world_size()
dist.all_gather_object(lines, f"rank {dist.get_rank()}/{dist.get_world_size()} sessions {sessions()} "
                              f"cuda {os.environ.get('CUDA_VISIBLE_DEVICES')}")
if dist.get_rank() == 0:
    print("\\n".join(lines))
    print("---")
    print(f"val_bpb: {total.item() / 10:.6f}")
dist.destroy_process_group()
'''
RANK_LINE = re.compile(r"^rank (\d)/(\d) sessions (\S+) cuda (\S+)$", re.MULTILINE)


def test_a_trial_spans_two_worker_nodes_through_a_placement_group(tmp_path, tiny_data_dir, cluster):
    """--nodes-per-trial 2 --gpus-per-trial 2: one actor on each of two distinct worker nodes (a
    STRICT_SPREAD placement group), torch's launcher on each meeting at the first; the four ranks
    form one gloo group; each node's ranks see the two GPUs Ray bound there, as recorded; the
    first node's share is the trial, the other's log kept beside it; nothing left after."""
    repo = init_repo(tmp_path / "repo", {"train.py": TWO_NODE_TRAIN})
    proc = autoloop(repo, "run", "--budget", "2", "--timeout", "120", "--proposer", "queue", "--tag", "t",
                    "--command", f"{sys.executable} train.py", "--executor", "ray", "--nodes-per-trial", "2",
                    "--gpus-per-trial", "2", data_dir=tiny_data_dir, env={"AUTOLOOP_DEVICE": ""}, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "each trial 2 actors, one per node (a placement group, STRICT_SPREAD)" in proc.stdout, proc.stdout
    (record,) = assert_invariants(repo)
    assert record["metric"] == 1.0, record   # four ranks over two nodes all-reduced
    log = (repo / "results" / record["log_path"]).read_text()
    ranks = {int(r[0]): r for r in RANK_LINE.findall(log)}
    assert sorted(ranks) == [0, 1, 2, 3] and {r[1] for r in ranks.values()} == {"4"}, log
    node_of = {rank: {name for name, p in cluster.procs.items() if str(p.pid) in r[2].split(",")}
               for rank, r in ranks.items()}
    assert all(len(names) == 1 and next(iter(names)).startswith("worker") for names in node_of.values()), node_of
    assert node_of[0] == node_of[1] != node_of[2] == node_of[3], node_of   # two ranks on each of two workers
    extra = record["extra"]
    nodes = extra["nodes"]
    gpu_nodes = {n["NodeID"] for n in cluster.nodes() or [] if n["Resources"].get("GPU")}
    assert len(nodes) == 2 and len({n["node_id"] for n in nodes}) == 2, nodes
    assert {n["node_id"] for n in nodes} <= gpu_nodes, nodes   # worker nodes, never the head
    assert (extra["node_id"], extra["gpu_ids"]) == (nodes[0]["node_id"], nodes[0]["gpu_ids"]), extra
    for rank, r in ranks.items():   # node rank k holds global ranks 2k and 2k + 1
        bound = nodes[rank // 2]["gpu_ids"]
        assert len(bound) == 2 and r[3] == ",".join(bound), (rank, r, nodes)
    second = (repo / "results" / record["log_path"]).with_name(f"{Path(record['log_path']).stem}.node1.log")
    assert second.exists() and "val_bpb" not in second.read_text()   # the other node's share, kept apart
    assert not live_actors(cluster.address) and not live_groups(cluster.address)


def test_more_nodes_per_trial_than_the_cluster_has_is_one_line(tmp_path, tiny_data_dir, cluster):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    proc = autoloop(repo, *night("--gpus-per-trial", "1", "--nodes-per-trial", "3"), data_dir=tiny_data_dir,
                    env={"AUTOLOOP_DEVICE": ""})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "--nodes-per-trial 3: the Ray cluster at " in proc.stderr, proc.stderr
    assert "has 2 node(s) of at least 1 GPU(s)" in proc.stderr and "needs 3 distinct ones" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()
    assert not live_groups(cluster.address)


def two_node_hang_train(runs: Path, pids: Path) -> str:
    """Each rank marks its attempt in ``runs`` (a folder per attempt, named by its process
    token); in the first attempt each rank writes its pid into ``pids`` and hangs."""
    return fake_train(0.8, f"import os, pathlib, time\nruns = pathlib.Path({str(runs)!r})\n"
                           "(runs / os.environ['AUTOLOOP_TRIAL_TOKEN'].split('n')[0]).mkdir(parents=True, "
                           "exist_ok=True)\n"
                           "if len(list(runs.iterdir())) == 1:\n"
                           f"    pathlib.Path({str(pids)!r}, os.environ['RANK']).write_text(str(os.getpid()))\n"
                           "    time.sleep(300)\n")


def test_a_node_lost_mid_way_through_a_two_node_trial_ends_it_all_and_it_runs_again(tmp_path, cluster):
    """The second node of a two-node trial killed whole: every share ended (the first node's by
    its runner, the lost one's strays here), the group removed, Ray's reason in the record, the
    trial submitted again (placed once the node is back) and counted apart; nothing left."""
    runs, pids = tmp_path / "attempts", tmp_path / "pids"
    pids.mkdir()
    thread, result, jobs, executor = executor_run(tmp_path, two_node_hang_train(runs, pids), nodes=2)
    wait_for("the trial to run on both nodes", lambda: len(list(pids.iterdir())) == 2 or not thread.is_alive())
    assert len(list(pids.iterdir())) == 2, result
    first, second = int((pids / "0").read_text()), int((pids / "1").read_text())
    node = cluster.node_of(second)
    assert node and node.startswith("worker") and cluster.node_of(first) not in (node, None), node
    assert jobs[0]["actors"] == [jobs[0]["job_id"], jobs[0]["job_id"] + "-n1"] and jobs[0]["placement_group"], jobs
    cluster.kill_node(node)
    try:
        wait_for("the trial submitted again", lambda: len(jobs) == 2 or not thread.is_alive())
        assert not alive(first) and not alive(second), "a share of the lost trial was left running"
        assert jobs[0]["placement_group"] not in live_groups(cluster.address)
        cluster.start_worker(node)   # two worker nodes again: the new group can be placed
        thread.join(240)
        assert result, "the executor never returned"
        outcome = result[0]
        assert outcome.metric == 0.8 and classify(outcome).kind == "ok", outcome
        resubmitted = outcome.job.get("resubmitted") or []
        assert len(resubmitted) == 1 and resubmitted[0].startswith(f"job {jobs[0]['job_id']}: NODE_DIED ("), \
            outcome.job
        kept = outcome.log_path.with_name(f"1-1.job-{jobs[0]['job_id']}.log").read_text()
        assert f"ray actor {jobs[0]['job_id']}-n1 lost its node" in kept and "submitted again" in kept, kept
        assert len(list(runs.iterdir())) == 2
        assert not live_actors(cluster.address) and not live_groups(cluster.address)
    finally:
        if node not in cluster.procs:
            cluster.start_worker(node)   # the session's cluster whole again for the next tests
