"""A whole night in one Slurm allocation: trials as job steps (srun --exact) of it, against the
private cluster (tests/slurm_cluster.py). The night is examples/slurm-night.sbatch itself,
submitted with sbatch (the orchestrator in step 0), or a salloc shell's command; stopped by
the script's SIGTERM or a terminal's Ctrl-C, nothing is left: no job, no step.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from helpers.cluster_night import fake_train, hang_train, releasable_train, wait_for
from helpers.git import init_repo
from helpers.loop import assert_invariants, loop_env, queue_file
from slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture
from test_slurm_cluster import TWO_NODE_TRAIN, together_train

from autoloop.config.settings import Settings
from autoloop.execution.executors.slurm_steps import step_options, wants_steps

pytestmark = pytest.mark.xdist_group("slurm_cluster")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "slurm-night.sbatch"
LOOP_ARGS = ["--proposer", "queue", "--tag", "t", "--device", "cpu", "--command", f"{sys.executable} train.py",
             "--noise-runs", "0", "--sanity-bound", "0", "--no-machine-probe", "--timeout", "60"]


@pytest.fixture
def cluster(slurm_cluster):  # noqa: F811
    yield slurm_cluster
    slurm_cluster.drain_queue()


def steps_of(cluster, job_id: str) -> list[str]:
    """The job's steps still known to Slurm (squeue -s), the batch step included."""
    return cluster.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i", check=False).split()


def sbatch_night(cluster, repo: Path, data_dir: Path, *args: str) -> str:
    """examples/slurm-night.sbatch submitted as a site's user would, with this cluster's sizes
    (no GPUs, 2 CPUs: the orchestrator's step and one trial's); its job id."""
    env = {**os.environ, **cluster.env, **loop_env(data_dir), "HOURS": "1", "BUDGET": "2", "WORKERS": "1",
           "AUTOLOOP": f"{sys.executable} -m autoloop.cli"}
    # --time well above the script's --signal=B:TERM@600 (ten minutes before the limit), which
    # with a 10-minute limit would stop the night as it starts.
    out = subprocess.run(["sbatch", "--parsable", "--gres=none", "--cpus-per-task=2", "--time=30",
                          f"--output={repo.parent / 'night-%j.out'}", str(EXAMPLE), *LOOP_ARGS, *args],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return out.strip().split(";")[0]


def recorded_step(repo: Path) -> str | None:
    job = json.loads((repo / "results" / "state.json").read_text()).get("job")
    return job["job_id"] if job else None


def gone(cluster, job_id: str) -> bool:
    return job_id not in cluster.queue() and not steps_of(cluster, job_id)


def test_sigterm_to_the_nights_script_stops_it_and_leaves_no_step(tmp_path, tiny_data_dir, cluster):
    marker = tmp_path / "started"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hang.py", hang_train(marker), "hangs")
    job_id = sbatch_night(cluster, repo, tiny_data_dir)
    wait_for("the hanging trial's step to run", lambda: marker.exists() or gone(cluster, job_id), 240)
    assert marker.exists(), (tmp_path / f"night-{job_id}.out").read_text()
    wait_for("state.json to name the step", lambda: recorded_step(repo) is not None, 60)
    step = recorded_step(repo)
    assert step.startswith(f"{job_id}.") and step in steps_of(cluster, job_id), (step, steps_of(cluster, job_id))
    # As a person stops the night (and as the time limit's --signal=B:TERM does): SIGTERM to
    # the script's shell, whose trap passes it to the orchestrator alone.
    cluster.run("scancel", "--batch", "--signal=TERM", job_id)
    wait_for("the night's job to end", lambda: gone(cluster, job_id), 120)
    hung = [r for r in assert_invariants(repo) if r["description"] == "hangs"]
    assert hung and hung[0]["reason"] == "interrupted (SIGTERM)" and hung[0]["extra"]["job_id"] == step, hung


def test_ctrl_c_in_a_salloc_shell_ends_both_workers_steps(tmp_path, tiny_data_dir, cluster):
    a, b, alone = tmp_path / "a", tmp_path / "b", tmp_path / "alone"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    # Each waits until the other has started (both steps at once), then hangs.
    hang = "import time\ntime.sleep(300)\n"
    queue_file(repo, "01_a.py", together_train(0.9, a, b, alone) .replace('print("---")', hang + 'print("---")'), "a")
    queue_file(repo, "02_b.py", together_train(0.95, b, a, alone).replace('print("---")', hang + 'print("---")'), "b")
    env = {**os.environ, **cluster.env, **loop_env(tiny_data_dir)}
    # The loop is salloc's command (here, as on a login node); slurm_mode auto: steps, as SLURM_JOB_ID is set.
    night = subprocess.Popen(["salloc", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--time=10",
                              sys.executable, "-m", "autoloop.cli", "run", "--budget", "2", "--executor", "slurm",
                              "--workers", "2", *LOOP_ARGS], cwd=repo, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for("both trials' steps to run", lambda: (a.exists() and b.exists()) or night.poll() is not None, 240)
        assert a.exists() and b.exists(), night.communicate()[0] if night.poll() is not None else ""
        (job_id,) = cluster.queue()
        assert len([s for s in steps_of(cluster, job_id) if re.fullmatch(r"\d+\.\d+", s)]) == 2
        # A terminal's Ctrl-C reaches salloc's command, the terminal's foreground process group
        # (salloc hands it the terminal), not salloc itself, which would revoke the allocation.
        (loop,) = psutil.Process(night.pid).children()
        loop.send_signal(signal.SIGINT)
        out, _ = night.communicate(timeout=120)
    finally:
        if night.poll() is None:
            os.killpg(night.pid, signal.SIGKILL)
    assert night.returncode == 130, out
    assert "each trial is a step of allocation" in out and "1 CPU(s); 2 at once" in out, out
    wait_for("the allocation to end", lambda: gone(cluster, job_id), 60)
    tried = {r["description"]: r for r in assert_invariants(repo) if r["description"] in ("a", "b")}
    assert {r["reason"] for r in tried.values()} == {"interrupted (SIGINT)"}, tried
    assert tried["a"]["extra"]["job_id"] != tried["b"]["extra"]["job_id"], tried
    assert not alone.exists()


def test_steps_share_the_allocations_cpus_and_memory_between_the_workers():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "64(x2)", "SLURM_MEM_PER_NODE": "512000",
           "SLURM_GPUS_PER_NODE": "8"}
    settings = Settings(executor="slurm", workers=8)
    argv, plan = step_options(settings, env)
    assert {"--exact", "--cpus-per-task=8", "--gres=gpu:1", "--mem=64000M"} <= set(argv), argv
    assert "step of allocation 7" in plan and "1 GPU (the allocation has 8 on its node)" in plan
    # In a step of its own (the sbatch example's step 0), the orchestrator's CPU is not shared out,
    # and the memory is what the script passes.
    argv, _ = step_options(settings.model_copy(update={"slurm_options": {"mem": "60G"}}),
                           {**env, "SLURM_STEP_ID": "0", "SLURM_CPUS_ON_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "65"})
    assert {"--cpus-per-task=8", "--mem=60G"} <= set(argv), argv
    # A trial over two nodes of the allocation: one task per node, each its node's share.
    argv, plan = step_options(settings.model_copy(update={"nodes_per_trial": 2, "workers": 2}), env)
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=32"} <= set(argv), argv
    assert "1 GPU (the allocation has 8 on its node), 32 CPU(s) on each of 2 nodes; 2 at once" in plan, plan
    assert wants_steps(settings, env) and not wants_steps(settings, {})
    assert not wants_steps(settings.model_copy(update={"slurm_mode": "jobs"}), env)


def test_steps_outside_an_allocation_is_one_clear_line(tmp_path):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "--executor", "slurm", "--slurm-mode",
                           "steps", "--budget", "2", *LOOP_ARGS], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "does not run inside a Slurm allocation (SLURM_JOB_ID is not set)" in proc.stdout + proc.stderr


def gpu_train(value: float, mine: Path, other: Path, seen: Path) -> str:
    """Says which GPUs Slurm bound to its step, then waits for the other trial's step (both at once)."""
    return together_train(value, mine, other, seen.with_name("alone")).replace(
        "import pathlib, time\n",
        "import json, os, pathlib, time\n"
        f"pathlib.Path({str(seen)!r}, os.environ['SLURM_STEP_ID']).write_text(json.dumps("
        "{k: os.environ.get(k) for k in ('SLURM_STEP_GPUS', 'SLURMD_NODENAME', 'SLURM_CPUS_PER_TASK')}))\n", 1)


def test_the_nights_trial_steps_get_disjoint_gpus_on_a_gpu_partition(tmp_path, tiny_data_dir, cluster):
    from slurm_cluster import GPU_PARTITION

    a, b, seen = tmp_path / "a", tmp_path / "b", tmp_path / "seen"
    seen.mkdir()
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_a.py", gpu_train(0.9, a, b, seen), "a")
    queue_file(repo, "02_b.py", gpu_train(0.95, b, a, seen), "b")
    env = {**os.environ, **cluster.env, **loop_env(tiny_data_dir), "HOURS": "1", "BUDGET": "2", "WORKERS": "2",
           "AUTOLOOP": f"{sys.executable} -m autoloop.cli"}
    env.pop("AUTOLOOP_DEVICE")   # the trials' device is the node's, not this host's
    args = [arg for arg in LOOP_ARGS if arg not in ("--device", "cpu")]
    # A GPU node of four: the orchestrator's step (no GPU, one CPU) and two trials of one GPU each.
    job_id = subprocess.run(["sbatch", "--parsable", f"--partition={GPU_PARTITION}", "--gres=gpu:4",
                             "--cpus-per-task=3", "--time=30", f"--output={tmp_path / 'night-%j.out'}", str(EXAMPLE),
                             *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60,
                            check=True).stdout.strip().split(";")[0]
    wait_for("the night's job to end", lambda: gone(cluster, job_id), 240)
    out = (tmp_path / f"night-{job_id}.out").read_text()
    assert "1 GPU (the allocation has 4 on its node), 1 CPU(s); 2 at once" in out, out
    views = [json.loads(p.read_text()) for p in sorted(seen.iterdir())]
    assert len(views) == 2 and not (tmp_path / "alone").exists(), (views, out[-4000:])
    gpus = [set(v["SLURM_STEP_GPUS"].split(",")) for v in views]
    assert all(len(g) == 1 for g in gpus) and not gpus[0] & gpus[1], views   # Slurm's binding: one each, disjoint
    assert views[0]["SLURMD_NODENAME"] == views[1]["SLURMD_NODENAME"] and not cluster.queue()
    ledger = assert_invariants(repo)
    assert [r["description"] for r in ledger] == ["baseline", "a", "b"] or [
        r["description"] for r in ledger] == ["baseline", "b", "a"], ledger
    # Step 0 is the orchestrator; each trial a step after it, of the same job, its output kept.
    steps = [r["extra"]["job_id"] for r in ledger]
    assert all(r["extra"]["cluster"] == "steps" for r in ledger), ledger
    assert all(re.fullmatch(rf"{job_id}\.[1-9]\d*", s) for s in steps) and len(set(steps)) == 3, steps
    assert all(Path(r["extra"]["job_stdout"]).exists() for r in ledger)
    assert not steps_of(cluster, job_id)


def test_resume_after_kill_9_reattaches_to_the_orphaned_step_and_takes_its_result(tmp_path, tiny_data_dir, cluster):
    marker, release, out = tmp_path / "started", tmp_path / "release", tmp_path / "resume.out"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_better.py", releasable_train(0.9, marker, release), "better")
    env = {**os.environ, **cluster.env, **loop_env(tiny_data_dir)}
    loop = [sys.executable, "-m", "autoloop.cli", "run", "--budget", "2", "--executor", "slurm", *LOOP_ARGS]
    # The allocation outlives its first loop (an interactive salloc shell, where the person runs
    # the loop again after it died); `sleep` holds it here.
    holder = subprocess.Popen(["salloc", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--time=10", "bash", "-c",
                               f"{shlex.join(loop)}; sleep 300"], cwd=repo, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    resumed = None
    try:
        wait_for("the trial's step to run", lambda: marker.exists() or holder.poll() is not None, 240)
        wait_for("state.json to name the step", lambda: recorded_step(repo) is not None, 60)
        step = recorded_step(repo)
        job_id = step.split(".")[0]
        (orchestrator,) = [p for p in psutil.Process(holder.pid).children(recursive=True)
                           if p.cmdline()[1:3] == ["-m", "autoloop.cli"]]
        orchestrator.kill()   # kill -9: no stop, no cancel
        orchestrator.wait(30)
        assert step in steps_of(cluster, job_id)   # the step outlived its orchestrator
        with open(out, "w") as f:
            resumed = subprocess.Popen([*loop, "--resume"], cwd=repo, env={**env, "SLURM_JOB_ID": job_id},
                                       stdout=f, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        wait_for("the resume to re-attach", lambda: "re-attached" in out.read_text() or resumed.poll() is not None)
        assert f"re-attached to slurm step {step} RUNNING" in out.read_text(), out.read_text()
        assert step in steps_of(cluster, job_id)   # waited for, not cancelled
        release.write_text("go")
        assert resumed.wait(120) == 0, out.read_text()
        assert step not in steps_of(cluster, job_id)
    finally:
        if resumed is not None and resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
        os.killpg(holder.pid, signal.SIGKILL)   # salloc's allocation is ended by the fixture's drain
    said = out.read_text()
    assert f"its job {step} finished meanwhile; its result taken (keep" in said and "cancelled" not in said, said
    better = [r for r in assert_invariants(repo) if r["description"] == "better"]
    assert len(better) == 1 and better[0]["status"] == "keep" and better[0]["metric"] == 0.9, better
    assert better[0]["extra"]["collected"] and better[0]["extra"]["job_id"] == step, better[0]


def node_train(runs: Path, nodes: Path) -> str:
    """Counts its runs and notes the node of each (the step's SLURMD_NODENAME); the first hangs."""
    return fake_train(0.8, f"import os, pathlib, time\np = pathlib.Path({str(runs)!r})\n"
                           "n = len(p.read_text()) if p.exists() else 0\np.write_text('x' * (n + 1))\n"
                           f"with open({str(nodes)!r}, 'a') as f: f.write(os.environ['SLURMD_NODENAME'] + '\\n')\n"
                           "if n < 1: time.sleep(300)\n")


@pytest.mark.parametrize("retries", [1, 0])
def test_a_step_whose_node_fails_is_started_again_on_a_node_the_allocation_keeps(tmp_path, cluster, monkeypatch,
                                                                                 retries):
    """retries 1: started again, its result the trial's; retries 0: the cluster's end, not a crash."""
    from autoloop.execution.executors.slurm_steps import SlurmStepExecutor
    from autoloop.execution.runner import RunSpec

    runs, nodes = tmp_path / "runs.txt", tmp_path / "nodes.txt"
    # Two nodes, --no-kill: the allocation outlives one of them (as a site's night over several nodes).
    holder = subprocess.Popen(["salloc", "--no-kill", "-p", "multi", "--nodes=2", "--ntasks=2", "--cpus-per-task=1",
                               "--time=10", "sleep", "300"], env={**os.environ, **cluster.env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    down = None
    try:
        wait_for("the allocation", lambda: len(cluster.queue()) == 1 and "RUNNING" in cluster.run(
            "scontrol", "show", "job", cluster.queue()[0]), 120)
        (job_id,) = cluster.queue()
        for key, value in {**cluster.env, "SLURM_JOB_ID": job_id}.items():
            monkeypatch.setenv(key, value)   # srun finds the allocation as inside salloc's shell
        work = tmp_path / "ws"
        work.mkdir()
        (work / "train.py").write_text(node_train(runs, nodes))
        spec = RunSpec(command=[sys.executable, "train.py"], cwd=work, log_path=tmp_path / "runs" / "1-1.log",
                       budget_s=1, timeout_s=120, sample_interval_s=0.05, grace_s=2)
        executor = SlurmStepExecutor(tmp_path / "steps", ["--exact", "--nodes=1", "--ntasks=1", "--cpus-per-task=1"],
                                     job_id, poll_s=0.2, retries=retries, backoff=0.1)
        jobs: list[dict] = []
        result: list = []
        thread = threading.Thread(target=lambda: result.append(executor.run(spec, on_job=jobs.append)), daemon=True)
        thread.start()
        # Its node known and its step announced (state.json would name it) before the node goes down.
        wait_for("the first step to run", lambda: nodes.exists() and nodes.read_text().strip() and len(jobs) == 1)
        down = nodes.read_text().split()[0]
        cluster.run("scontrol", "update", f"nodename={down}", "state=down", "reason=autoloop-test")
        thread.join(180)
    finally:
        if down is not None:
            cluster.run("scontrol", "update", f"nodename={down}", "state=resume", check=False)
        os.killpg(holder.pid, signal.SIGKILL)   # the fixture's drain ends the allocation
    assert result, "the executor never returned"
    outcome = result[0]
    if retries == 0:
        assert nodes.read_text().split() == [down] and len(jobs) == 1, jobs
        assert outcome.cluster_ended == f"step {jobs[0]['job_id']} lost its node {down} (NODE_FAIL)", outcome
        assert outcome.metric is None and "resubmitted" not in outcome.job
        return
    first, second = nodes.read_text().split()
    assert first == down and second != down, (first, second)   # started again where the allocation still is
    assert outcome.job_error is None and outcome.metric == 0.8 and outcome.cluster_ended is None, outcome
    (said,) = outcome.job["resubmitted"]
    assert said == f"step {jobs[0]['job_id']}: lost its node {down} (NODE_FAIL)", said
    assert outcome.job["job_id"] == jobs[1]["job_id"] != jobs[0]["job_id"], jobs
    kept = outcome.log_path.with_name(f"{outcome.log_path.stem}.job-{jobs[0]['job_id']}.log")
    assert f"lost its node {down} (NODE_FAIL); the trial is submitted again" in kept.read_text()


def test_a_trial_spans_two_nodes_of_the_allocation_as_one_step(tmp_path, cluster, monkeypatch):
    """nodes_per_trial 2 in steps mode: one step, a task on each of two nodes of the allocation,
    whose launchers meet at the step's first node; the first node's share is the trial."""
    from autoloop.execution.executors.slurm_steps import SlurmStepExecutor
    from autoloop.execution.runner import RunSpec

    holder = subprocess.Popen(["salloc", "-p", "multi", "--nodes=2", "--ntasks=2", "--cpus-per-task=1",
                               "--time=10", "sleep", "300"], env={**os.environ, **cluster.env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for("the allocation", lambda: len(cluster.queue()) == 1 and "RUNNING" in cluster.run(
            "scontrol", "show", "job", cluster.queue()[0]), 120)
        (job_id,) = cluster.queue()
        for key, value in {**cluster.env, "SLURM_JOB_ID": job_id}.items():
            monkeypatch.setenv(key, value)
        work = tmp_path / "ws"
        work.mkdir()
        (work / "train.py").write_text(TWO_NODE_TRAIN)
        spec = RunSpec(command=[sys.executable, "train.py"], cwd=work, log_path=tmp_path / "runs" / "1-1.log",
                       budget_s=1, timeout_s=120, sample_interval_s=0.05, grace_s=2)
        settings = Settings(executor="slurm", nodes_per_trial=2, device="cpu")
        executor = SlurmStepExecutor.from_settings(settings, tmp_path, {"SLURM_JOB_ID": job_id,
                                                                        "SLURM_JOB_CPUS_PER_NODE": "1(x2)"})
        assert "on each of 2 nodes" in (executor.plan or ""), executor.plan
        jobs: list[dict] = []
        outcome = executor.run(spec, on_job=jobs.append)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
    assert outcome.metric == 3.0 and outcome.exit_code == 0, outcome   # ranks 1 + 2, all-reduced over both nodes
    log = outcome.log_path.read_text()
    ranks = re.search(r"ranks on \d+@(\S+),\d+@(\S+)", log)
    assert ranks and {ranks[1], ranks[2]} == {cluster.node, cluster.node2}, log   # one share on each node
    second = outcome.log_path.with_name(f"{outcome.log_path.stem}.node1.log")   # the other node's share
    assert second.exists() and "val_bpb" not in second.read_text()
    assert re.fullmatch(rf"{job_id}\.\d+", jobs[0]["job_id"]), jobs
