"""The slurm executor against a real Slurm cluster: a private slurmctld + slurmd on this machine
(tests/slurm_cluster.py; accounting off, so job states come from scontrol). Jobs are real
sbatch jobs; cancellations are real scancel calls; the orchestrator is killed for real.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.cluster_night import fake_train, hang_train, releasable_train, start_autoloop, wait_for
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, queue_file
from slurm_cluster import GPU_PARTITION, slurm_cluster  # noqa: F401 - the session fixture

from autoloop.core.classify import classify

pytest.importorskip("submitit")

from autoloop.execution.executors.slurm import SlurmExecutor

# One cluster serves them all: with `-n 2 --dist loadgroup` they run on one worker.
pytestmark = pytest.mark.xdist_group("slurm_cluster")


def night(*extra: str) -> list[str]:
    return ["run", "--budget", "2", "--timeout", "60", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--executor", "slurm", "--noise-runs", "0",
            "--sanity-bound", "0", *extra]


def start_night(repo: Path, data_dir: Path, *extra: str) -> subprocess.Popen:
    return start_autoloop(repo, data_dir, night(*extra))


@pytest.fixture
def cluster(slurm_cluster):  # noqa: F811
    yield slurm_cluster
    slurm_cluster.drain_queue()   # a failed test must not leave the next one a busy node


def test_a_night_through_the_cluster_asks_no_gpu_of_a_partition_without(tmp_path, tiny_data_dir, cluster):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_better.py", fake_train(0.9), "better")
    proc = autoloop(repo, *night(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slurm: no GPU asked for: the default partition has none (sinfo GRES)" in proc.stdout, proc.stdout
    assert "Bypassing sacct error" not in proc.stdout + proc.stderr   # no warning at every poll
    ledger = assert_invariants(repo)
    assert [(r["description"], r["status"]) for r in ledger] == [("baseline", "keep"), ("better", "keep")]
    for record in ledger:
        extra = record["extra"]
        assert extra["cluster"] == "slurm" and extra["job_id"].isdigit(), record
        assert Path(extra["job_stdout"]).exists(), extra   # the job's own output, named in the record
        assert "autoloop" in cluster.run("scontrol", "show", "job", extra["job_id"])   # a real job
    assert not cluster.queue()


def test_ctrl_c_cancels_the_running_job(tmp_path, tiny_data_dir, cluster):
    marker = tmp_path / "started"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hang.py", hang_train(marker), "hangs")
    orchestrator = start_night(repo, tiny_data_dir)
    try:
        wait_for("the hanging trial to run", lambda: marker.exists() or orchestrator.poll() is not None)
        assert marker.exists() and cluster.queue(), "the hanging job never ran"
        os.killpg(orchestrator.pid, signal.SIGINT)   # as a terminal's Ctrl-C does
        out, _ = orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    assert orchestrator.returncode == 130, out
    wait_for("squeue to drain", lambda: not cluster.queue(), 60)
    hung = [r for r in assert_invariants(repo) if r["description"] == "hangs"]
    assert hung and hung[0]["reason"] == "interrupted (SIGINT)", hung   # our stop, not the scheduler's


def test_sigterm_of_the_orchestrator_cancels_the_running_job(tmp_path, tiny_data_dir, cluster):
    marker = tmp_path / "started"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hang.py", hang_train(marker), "hangs")
    orchestrator = start_night(repo, tiny_data_dir)
    try:
        wait_for("the hanging trial to run", lambda: marker.exists() or orchestrator.poll() is not None)
        job_id = json.loads((repo / "results" / "state.json").read_text())["job"]["job_id"]
        assert marker.exists() and job_id in cluster.queue(), "the hanging job never ran"
        status = autoloop(repo, "status", data_dir=tiny_data_dir).stdout   # the job's own output files, while it runs
        assert f"job {job_id} (slurm) runs #1: stdout " in status and "_log.err" in status, status
        os.kill(orchestrator.pid, signal.SIGTERM)   # the orchestrator alone, as `kill` or a scheduler sends it
        out, _ = orchestrator.communicate(timeout=120)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    assert orchestrator.returncode == 143, out
    wait_for("squeue to drain", lambda: not cluster.queue(), 60)
    hung = [r for r in assert_invariants(repo) if r["description"] == "hangs"]
    assert hung and hung[0]["reason"] == "interrupted (SIGTERM)" and hung[0]["extra"]["job_id"] == job_id, hung
    status = autoloop(repo, "status", data_dir=tiny_data_dir).stdout   # and those of the last crashed job, afterwards
    assert f"last crashed job: {job_id} (#1: interrupted (SIGTERM)): stdout {hung[0]['extra']['job_stdout']}" in status


def executor_run(tmp_path: Path, script: str, pending_timeout_s: float | None = None, minutes: int = 5,
                 retries: int = 3, **parameters):
    """Run one trial job through SlurmExecutor in a thread; (thread, result holder, spec)."""
    from autoloop.execution.runner import RunSpec

    work = tmp_path / "ws"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(script)
    spec = RunSpec(command=[sys.executable, "train.py"], cwd=work, log_path=tmp_path / "runs" / "1-1.log",
                     budget_s=1, timeout_s=120, sample_interval_s=0.05, grace_s=2)
    executor = SlurmExecutor("slurm", tmp_path / "slurm", {"time": minutes, "gpus_per_node": 0, **parameters},
                             poll_s=0.2, pending_timeout_s=pending_timeout_s, retries=retries,
                             backoff=0.1)   # the waits between resubmissions: not this test's subject
    jobs: list[dict] = []
    result: list = []
    thread = threading.Thread(target=lambda: result.append(executor.run(spec, on_job=jobs.append)), daemon=True)
    thread.start()
    return thread, result, jobs


def test_a_job_cancelled_from_outside_is_classified_with_slurms_reason(tmp_path, cluster):
    marker = tmp_path / "started"
    thread, result, jobs = executor_run(tmp_path, hang_train(marker))
    wait_for("the job to start", lambda: marker.exists())
    cluster.run("scancel", jobs[0]["job_id"])
    thread.join(120)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.job_error and f"job {jobs[0]['job_id']}" in outcome.job_error, outcome
    assert "CANCELLED" in outcome.job_error, outcome.job_error   # scontrol's JobState, not only "SIGTERM"
    verdict = classify(outcome)
    assert verdict.kind == "fundamental" and "CANCELLED" in verdict.reason, verdict
    assert not cluster.queue()


def counting_train(runs: Path, hang_runs: int) -> str:
    """Counts its runs in ``runs`` (one x each); the first ``hang_runs`` of them hang."""
    return fake_train(0.8, f"import pathlib, time\np = pathlib.Path({str(runs)!r})\n"
                           "n = len(p.read_text()) if p.exists() else 0\np.write_text('x' * (n + 1))\n"
                           f"print('step 00001 (1.0%) | loss: 9.0', flush=True)\nif n < {hang_runs}: time.sleep(300)\n")


def runs_of(runs: Path) -> int:
    return len(runs.read_text()) if runs.exists() else 0


def preempt(cluster) -> None:
    """A job of the higher-priority partition that needs the whole node: Slurm preempts ours."""
    cluster.run("sbatch", "-p", "urgent", "-c", "2", "-o", "/dev/null", "--wrap", "sleep 1")


def test_a_preempted_trial_is_submitted_again_once(tmp_path, cluster):
    runs = tmp_path / "runs.txt"
    thread, result, jobs = executor_run(tmp_path, counting_train(runs, hang_runs=1))
    wait_for("the job to start", lambda: runs_of(runs) == 1)
    preempt(cluster)
    thread.join(180)
    assert result, "the executor never returned"
    outcome = result[0]
    assert runs_of(runs) == 2 and len(jobs) == 2 and jobs[0]["job_id"] != jobs[1]["job_id"], jobs
    assert outcome.job_error is None and outcome.metric == 0.8, outcome   # the second run's result
    assert outcome.job["job_id"] == jobs[1]["job_id"]
    (said,) = outcome.job["resubmitted"]
    assert said.startswith(f"job {jobs[0]['job_id']}: PREEMPTED"), said
    kept = outcome.log_path.with_name(f"{outcome.log_path.stem}.job-{jobs[0]['job_id']}.log")
    assert "was preempted; the trial is submitted again" in kept.read_text()


def test_a_trial_preempted_past_its_retries_is_ended_by_the_cluster_with_slurms_reason(tmp_path, cluster):
    runs = tmp_path / "runs.txt"
    thread, result, jobs = executor_run(tmp_path, counting_train(runs, hang_runs=2), retries=1)
    wait_for("the job to start", lambda: runs_of(runs) == 1)
    preempt(cluster)
    wait_for("the trial to be submitted again and start", lambda: runs_of(runs) == 2)
    preempt(cluster)
    thread.join(180)
    assert result, "the executor never returned"
    outcome = result[0]
    assert len(jobs) == 2 and outcome.job["job_id"] == jobs[1]["job_id"], jobs
    assert outcome.job_error and "PREEMPTED" in outcome.job_error and jobs[1]["job_id"] in outcome.job_error
    # Still the cluster's end: the engine records it as ended, never as the change's crash.
    assert outcome.cluster_ended == f"job {jobs[1]['job_id']} was preempted (submitted 2 times)", outcome
    assert len(outcome.job["resubmitted"]) == 1


def test_a_trial_whose_node_goes_down_is_submitted_again_not_blamed(tmp_path, cluster):
    runs = tmp_path / "runs.txt"
    thread, result, jobs = executor_run(tmp_path, counting_train(runs, hang_runs=1))
    wait_for("the job to start", lambda: runs_of(runs) == 1)
    try:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=down", "reason=autoloop-test")
        wait_for("the trial to be submitted again", lambda: len(jobs) == 2)
    finally:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)
    thread.join(180)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.job_error is None and outcome.metric == 0.8 and runs_of(runs) == 2, outcome   # the second run's
    (said,) = outcome.job["resubmitted"]
    assert said.startswith(f"job {jobs[0]['job_id']}: NODE_FAIL"), said   # the cluster's word for the first end
    kept = outcome.log_path.with_name(f"{outcome.log_path.stem}.job-{jobs[0]['job_id']}.log")
    assert "lost its node (NODE_FAIL); the trial is submitted again" in kept.read_text()


def test_a_night_stops_when_the_cluster_keeps_ending_its_trials_and_blames_no_change(tmp_path, tiny_data_dir,
                                                                                      cluster):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    first = autoloop(repo, *night(), data_dir=tiny_data_dir)   # the baseline, then no more ideas
    assert first.returncode == 0, first.stdout + first.stderr
    for n, value in enumerate((0.9, 0.8, 0.7), 1):
        queue_file(repo, f"0{n}_better.py", fake_train(value), f"better {n}")
    blocker = cluster.run("sbatch", "--parsable", "-c", "2", "-o", "/dev/null", "--wrap", "sleep 300").strip()
    try:
        wait_for("the blocker to hold the node", lambda: "RUNNING" in cluster.run("scontrol", "show", "job", blocker))
        # Every trial's job waits past the queue's limit and is not submitted again (retries 0).
        proc = autoloop(repo, *night("--resume", "--slurm-pending-timeout", "2s", "--slurm-retries", "0",
                                     "--max-cluster-ends", "2"), data_dir=tiny_data_dir)
    finally:
        cluster.run("scancel", blocker)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("stopped: the cluster ended 2 trials in a row (preempted, node failure, lost, queue limit; "
            "--max-cluster-ends 2)") in proc.stdout, proc.stdout
    ledger = assert_invariants(repo)
    tried = [r for r in ledger if r["description"].startswith("better")]
    assert [r["status"] for r in tried] == ["ended", "ended"] and [r["crash"] for r in tried] == [None, None], tried
    assert all(r["reason"].startswith("ended by the cluster, not by the change: job ") and
               "waited in the queue past slurm_pending_timeout" in r["reason"] for r in tried), tried
    assert all(r["best"] == ledger[0]["commit"] for r in tried)   # the best unmoved
    assert "better" not in (repo / "results" / "results.tsv").read_text()   # nothing measured, nothing judged
    status = autoloop(repo, "status", data_dir=tiny_data_dir)
    assert "cluster ended 2 jobs (preempted, node failure, lost, queue limit)" in status.stdout, status.stdout
    assert "crash" not in status.stdout, status.stdout


def test_slurms_own_time_limit_is_a_timeout_with_its_reason(tmp_path, cluster):
    marker = tmp_path / "started"
    thread, result, jobs = executor_run(tmp_path, hang_train(marker), minutes=1)   # sbatch --time=1
    wait_for("the job to start", lambda: marker.exists() and jobs)
    # A limit of minutes would cost the test 60-100 s: the running job's end is moved to one
    # second from now instead (scontrol's EndTime, allowed on a running job; the limit stays
    # Slurm's to enforce). slurmctld checks limits every 30 s (PERIODIC_TIMEOUT in its
    # controller.c, not a setting), then sends the job SIGTERM, SIGKILL after KillWait: 4-35 s.
    cluster.run("scontrol", "update", f"JobId={jobs[0]['job_id']}", "EndTime=now+1")
    thread.join(240)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.timed_out and outcome.job_error and "TIMEOUT" in outcome.job_error, outcome
    assert "TimeLimit" in outcome.job_error, outcome.job_error   # Slurm's reason: its limit, not a cancel
    verdict = classify(outcome)
    assert verdict.kind == "timeout" and "TIMEOUT" in verdict.reason, verdict


def test_a_job_pending_too_long_is_cancelled_and_recorded(tmp_path, cluster):
    blocker = cluster.run("sbatch", "--parsable", "-c", "2", "-o", "/dev/null", "--wrap", "sleep 300").strip()
    wait_for("the blocker to hold the node", lambda: "RUNNING" in cluster.run("scontrol", "show", "job", blocker))
    thread, result, jobs = executor_run(tmp_path, fake_train(1.0), pending_timeout_s=3, retries=1)
    thread.join(120)
    assert result, "the executor never returned"
    outcome = result[0]
    # The queue's doing: submitted again once (retries=1), then ended by the cluster, naming the wait.
    assert len(jobs) == 2 and len(outcome.job["resubmitted"]) == 1, (jobs, outcome.job)
    assert outcome.job["resubmitted"][0] == f"job {jobs[0]['job_id']}: PENDING_LIMIT", outcome.job
    assert outcome.job_error and "still waiting in the queue after 3s" in outcome.job_error, outcome
    assert "PENDING" in outcome.job_error, outcome.job_error   # with Slurm's reason (Resources)
    assert cluster.queue() == [blocker]   # ours is gone, the blocker is not ours to cancel
    cluster.run("scancel", blocker)


def kill_9_while_running(repo: Path, data_dir: Path, marker: Path) -> dict:
    """Start a night, kill -9 it once its trial's job runs; the job recorded in state.json."""
    orchestrator = start_night(repo, data_dir)
    try:
        wait_for("the trial's job to run", lambda: marker.exists() or orchestrator.poll() is not None)
        assert marker.exists(), orchestrator.communicate()[0] if orchestrator.poll() is not None else ""
        job = json.loads((repo / "results" / "state.json").read_text())["job"]
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait(30)
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    return job


def test_resume_takes_the_result_of_an_orphaned_job_that_finished(tmp_path, tiny_data_dir, cluster):
    marker, release = tmp_path / "started", tmp_path / "release"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_better.py", releasable_train(0.9, marker, release), "better")
    job = kill_9_while_running(repo, tiny_data_dir, marker)
    release.write_text("go")   # the job finishes with nobody waiting for it
    wait_for("the orphaned job to finish", lambda: job["job_id"] not in cluster.queue(), 60)
    proc = autoloop(repo, *night("--resume"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"its job {job['job_id']} finished meanwhile; its result taken (keep" in proc.stdout, proc.stdout
    ledger = assert_invariants(repo)
    better = [r for r in ledger if r["description"] == "better"]
    assert len(better) == 1 and better[0]["status"] == "keep" and better[0]["metric"] == 0.9, better
    assert better[0]["extra"]["collected"] and better[0]["extra"]["job_id"] == job["job_id"], better[0]


def test_resume_does_not_trust_a_finished_orphan_whose_result_has_another_nonce(tmp_path, tiny_data_dir, cluster):
    marker, release = tmp_path / "started", tmp_path / "release"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    forged = releasable_train(0.5, marker, release).replace("os.environ['AUTOLOOP_NONCE']", "'0' * 16")
    queue_file(repo, "01_forged.py", forged, "forged")
    job = kill_9_while_running(repo, tiny_data_dir, marker)
    release.write_text("go")
    wait_for("the orphaned job to finish", lambda: job["job_id"] not in cluster.queue(), 60)
    proc = autoloop(repo, *night("--resume"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished meanwhile" not in proc.stdout, proc.stdout
    forged_records = [r for r in assert_invariants(repo) if r["description"] == "forged"]
    assert forged_records and forged_records[0]["status"] == "crash", forged_records
    assert forged_records[0]["reason"].startswith("interrupted"), forged_records


def resume_in_background(repo: Path, data_dir: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``autoloop run --resume`` with its output in ``out``, read while it runs."""
    return start_autoloop(repo, data_dir, night("--resume", *extra), out)


def test_resume_after_kill_9_reattaches_to_the_running_job_and_takes_its_result(tmp_path, tiny_data_dir, cluster):
    marker, release, out = tmp_path / "started", tmp_path / "release", tmp_path / "resume.out"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_better.py", releasable_train(0.9, marker, release), "better")
    job = kill_9_while_running(repo, tiny_data_dir, marker)
    assert job["job_id"] in cluster.queue()   # the job outlived its orchestrator
    resumed = resume_in_background(repo, tiny_data_dir, out)
    try:
        wait_for("the resume to re-attach", lambda: "re-attached" in out.read_text() or resumed.poll() is not None)
        assert f"recovery: trial 1.1: re-attached to slurm job {job['job_id']} RUNNING" in out.read_text()
        assert job["job_id"] in cluster.queue()   # waited for, not cancelled
        release.write_text("go")   # the job ends while the resumed night waits for it
        assert resumed.wait(120) == 0, out.read_text()
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    said = out.read_text()
    assert f"its job {job['job_id']} finished meanwhile; its result taken (keep" in said, said
    assert "cancelled" not in said, said
    better = [r for r in assert_invariants(repo) if r["description"] == "better"]
    assert len(better) == 1 and better[0]["status"] == "keep" and better[0]["metric"] == 0.9, better
    assert better[0]["extra"]["collected"] and better[0]["extra"]["job_id"] == job["job_id"], better[0]
    assert better[0]["extra"]["job_state"] == "COMPLETED", better[0]
    assert not cluster.queue()


def test_ctrl_c_while_resume_waits_for_the_orphaned_job_cancels_it(tmp_path, tiny_data_dir, cluster):
    marker, out = tmp_path / "started", tmp_path / "resume.out"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hang.py", hang_train(marker), "hangs")
    job = kill_9_while_running(repo, tiny_data_dir, marker)
    resumed = resume_in_background(repo, tiny_data_dir, out, "--no-rerun-interrupted")
    try:
        wait_for("the resume to re-attach", lambda: "re-attached" in out.read_text() or resumed.poll() is not None)
        assert f"re-attached to slurm job {job['job_id']} RUNNING" in out.read_text(), out.read_text()
        os.kill(resumed.pid, signal.SIGINT)   # as a terminal's Ctrl-C
        assert resumed.wait(120) == 130, out.read_text()
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    said = out.read_text()
    assert f"recovery: cancelled slurm job {job['job_id']} (was RUNNING" in said, said
    wait_for("squeue to drain", lambda: not cluster.queue(), 60)
    hung = [r for r in assert_invariants(repo) if r["description"] == "hangs"]
    assert hung and hung[0]["status"] == "crash" and hung[0]["reason"].startswith("interrupted"), hung


def together_train(value: float, mine: Path, other: Path, alone: Path) -> str:
    """Marks its start, then waits (at most 90 s) for the other trial's: both jobs at once."""
    return fake_train(value, f"import pathlib, time\npathlib.Path({str(mine)!r}).write_text('x')\n"
                             "t = time.monotonic()\n"
                             f"while not pathlib.Path({str(other)!r}).exists() and time.monotonic() - t < 90: "
                             "time.sleep(0.2)\n"
                             f"if not pathlib.Path({str(other)!r}).exists():\n"
                             f"    pathlib.Path({str(alone)!r}).write_text('x')\n")


def test_two_workers_run_two_jobs_at_once_on_the_cluster(tmp_path, tiny_data_dir, cluster):
    a, b, alone = tmp_path / "a", tmp_path / "b", tmp_path / "alone"
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_a.py", together_train(0.9, a, b, alone), "a")
    queue_file(repo, "02_b.py", together_train(0.95, b, a, alone), "b")
    proc = autoloop(repo, *night("--workers", "2"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not alone.exists(), "the two trials' jobs did not run at the same time"
    ledger = assert_invariants(repo)
    tried = {r["description"]: r for r in ledger if r["description"] in ("a", "b")}
    assert set(tried) == {"a", "b"} and all(r["status"] in ("keep", "discard") for r in tried.values()), ledger
    assert tried["a"]["extra"]["job_id"] != tried["b"]["extra"]["job_id"]
    assert {tried["a"]["worker"], tried["b"]["worker"]} == {0, 1}, tried
    assert not cluster.queue()


def test_resume_says_when_the_orphaned_job_had_ended(tmp_path, cluster):
    from autoloop.execution.executors import cancel_job

    done = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").strip()
    wait_for("the job to end", lambda: done not in cluster.queue(), 60)
    said = cancel_job({"executor": "slurm", "cluster": "slurm", "job_id": done, "folder": str(tmp_path)})
    assert said == f"slurm job {done} of the interrupted trial had ended (COMPLETED); nothing to cancel"


def test_waiting_for_an_orphaned_job_ends_at_its_end_its_bound_or_a_stop(tmp_path, cluster):
    from autoloop.execution.executors import wait_for_job

    live = cluster.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300").strip()
    job = {"executor": "slurm", "cluster": "slurm", "job_id": live, "folder": str(tmp_path)}
    heard: list[str] = []
    wait_for("the job to run", lambda: "RUNNING" in cluster.run("scontrol", "show", "job", live))
    assert not wait_for_job(job, time.time() + 1, on_progress=heard.append)   # past its bound: the caller cancels
    assert heard == [f"slurm job {live} RUNNING"], heard
    stop = threading.Event()
    stop.set()
    assert not wait_for_job(job, time.time() + 300, stop_event=stop)   # Ctrl-C: the caller cancels
    assert live in cluster.queue()   # waiting never cancels by itself
    cluster.run("scancel", live)
    assert wait_for_job(job, time.time() + 120)   # its end, whatever it was: the caller collects
    assert not wait_for_job({**job, "executor": "local"}, time.time() + 120)   # no engine of its own to wait for
    assert not wait_for_job({**job, "cluster": "local"}, time.time() + 120)   # submitit's local jobs: cancelled


# Each rank adds its rank + 1 over gloo, so the metric says how many joined (1 + 2 = 3 for two);
# rank 0 reports it with the node each rank ran on, as Slurm numbered them.
TWO_NODE_TRAIN = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
nodes = [None] * dist.get_world_size()
dist.all_gather_object(nodes, os.environ["SLURM_NODEID"] + "@" + os.environ["SLURMD_NODENAME"])
if dist.get_rank() == 0:
    print("ranks on", ",".join(nodes))
    print("---")
    print(f"val_bpb: {total.item():.6f}")
dist.destroy_process_group()
"""


def test_a_trial_spans_two_nodes_through_torchs_launcher(tmp_path, cluster):
    """Two slurmd on this host (tests/slurm_cluster.py, partition "multi"): the job's two tasks
    each start torch's launcher, which meet at the first node; rank 0's node reports."""
    thread, result, jobs = executor_run(tmp_path, TWO_NODE_TRAIN, partition="multi", nodes=2, ntasks_per_node=1)
    thread.join(180)
    assert result, "the executor never returned"
    outcome = result[0]
    assert outcome.metric == 3.0 and outcome.exit_code == 0, outcome
    log = outcome.log_path.read_text()
    assert f"ranks on 0@{cluster.node},1@{cluster.node2}" in log, log
    second = outcome.log_path.with_name(f"{outcome.log_path.stem}.node1.log")   # the other node's share
    assert second.exists() and "val_bpb" not in second.read_text()
    assert cluster.run("scontrol", "show", "job", jobs[0]["job_id"]).count("NumNodes=2") == 1


def gpu_train(value: float, barrier: Path | None = None) -> str:
    """Each rank says which node, job, devices and rank it was given; rank 0 reports ``value``.
    With ``barrier``, rank 0 waits (bounded) until two trials' jobs run at once, so that the
    GPUs they hold are held together."""
    wait = "" if barrier is None else (
        f"    barrier = pathlib.Path({str(barrier)!r})\n"
        "    (barrier / env['SLURM_JOB_ID']).write_text('x')\n"
        "    deadline = time.monotonic() + 90\n"
        "    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:\n"
        "        time.sleep(0.2)\n")
    return (f"import os, pathlib, time\nVALUE = {value!r}\nenv = os.environ\n"
            # One write per line: the two ranks share the log's pipe, and print() writes the end apart.
            "os.write(1, f\"rank {env['RANK']}/{env['WORLD_SIZE']} node {env['SLURMD_NODENAME']} \"\n"
            "         f\"job {env['SLURM_JOB_ID']} \"\n"
            "         f\"cuda {env.get('CUDA_VISIBLE_DEVICES')} job_gpus {env.get('SLURM_JOB_GPUS')}\\n\".encode())\n"
            "if env['RANK'] == '0':\n"
            "    import subprocess\n"   # what Slurm says it bound, asked while the job runs (it forgets after)
            "    said = subprocess.run(['scontrol', 'show', 'job', '-d', env['SLURM_JOB_ID']], capture_output=True,\n"
            "                          text=True).stdout\n"
            "    step_id = env['SLURM_JOB_ID'] + '.' + env['SLURM_STEP_ID']\n"
            "    step = subprocess.run(['scontrol', 'show', 'step', '-o', step_id], capture_output=True,\n"
            "                          text=True).stdout\n"
            "    gres = ' '.join(w for w in said.split() + step.split() if w.startswith(('GRES=', 'TRES=', 'CPUs=')))\n"
            "    os.write(1, f'slurm bound {gres}\\n'.encode())\n"
            + wait + "    os.write(1, f'---\\nval_bpb: {VALUE:.6f}\\n'.encode())\n")


RANK_LINE = re.compile(r"^rank (\d)/(\d) node (\S+) job (\d+) cuda (\S+) job_gpus (\S+)$", re.MULTILINE)


def test_each_trial_gets_the_gpus_slurm_bound_on_its_node(tmp_path, tiny_data_dir, cluster):
    """A site's shape: the orchestrator on a host without GPUs, the trials on GPU nodes. Each
    trial's two ranks see the two GPUs Slurm bound to its job (scontrol's IDX), no device
    variable from here; two trials at once hold disjoint GPUs; the job and its srun step have
    a GPU's share of the node's CPUs for each GPU. (On the code before: "--workers 2
    x --gpus-per-trial 2 needs 4 GPUs, 0 visible", nothing run.)"""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    repo = init_repo(tmp_path / "repo", {"train.py": gpu_train(1.0)})
    queue_file(repo, "01_a.py", gpu_train(0.9, barrier), "a")
    queue_file(repo, "02_b.py", gpu_train(0.95, barrier), "b")
    proc = autoloop(repo, "run", "--budget", "2", "--timeout", "90", "--proposer", "queue", "--tag", "t",
                    "--command", f"{sys.executable} train.py", "--executor", "slurm", "--slurm-partition",
                    GPU_PARTITION, "--workers", "2", "--gpus-per-trial", "2", "--max-trials", "2",
                    data_dir=tiny_data_dir, env={"AUTOLOOP_DEVICE": ""}, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "each on what slurm binds to its job on its node" in proc.stdout, proc.stdout
    ledger = assert_invariants(repo)
    assert sorted(r["description"] for r in ledger) == ["a", "b", "baseline"], ledger
    held: dict[str, set[tuple[str, str]]] = {}
    for record in ledger:
        assert record["status"] in ("keep", "discard"), record
        log = (repo / "results" / record["log_path"]).read_text()
        ranks = RANK_LINE.findall(log)
        assert sorted(r[:2] for r in ranks) == [("0", "2"), ("1", "2")], log   # two ranks, launched by torch
        assert len({r[2:] for r in ranks}) == 1, ranks   # both on one node, one job, the same devices
        _, _, node, job_id, cuda, job_gpus = ranks[0]
        assert job_id == record["extra"]["job_id"] and node in cluster.gpu_nodes, (ranks, record["extra"])
        gpus = cuda.split(",")
        assert len(gpus) == 2 and cuda == job_gpus, ranks   # what Slurm bound, nothing else
        said = re.search(r"^slurm bound (.*)$", log, re.MULTILINE)
        bound = re.search(r"\bGRES=gpu:\w+:2\(IDX:(\d)[-,](\d)\)", said.group(1) if said else "")
        assert bound and gpus == [bound.group(1), bound.group(2)], log
        # A GPU's share of the node's CPUs (4 CPUs / 4 GPUs) for the job, held by its srun step. (The
        # step would hold them without SRUN_CPUS_PER_TASK too: a plain srun step takes the job's
        # CPUs on the node; that export is checked in the batch script, tests/test_executors.py.)
        assert said.group(1).startswith("TRES=cpu=2,") and " CPUs=2 " in said.group(1), said.group(1)
        held[record["description"]] = {(node, gpu) for gpu in gpus}
        # Every record says where it ran: the node, the GPU model Slurm bound, the job's name.
        extra = record["extra"]
        model = "a100" if node == cluster.gpu_nodes[0] else "h100"
        assert (extra["node"], extra["gpu_model"]) == (node, model), extra
        assert extra["job_name"] == f"autoloop-t-{record['trial']}.{record['attempt']}", extra
    assert len(list(barrier.iterdir())) == 2   # the two trials' jobs ran at once
    assert not held["a"] & held["b"], held
    models = [r["extra"]["gpu_model"] for r in ledger]
    # Where the scheduler put them decides whether the models mixed; said when they did.
    assert ("warning: " in proc.stdout and "ran on GPU model" in proc.stdout) == (len(set(models)) > 1), proc.stdout


def test_more_gpus_per_trial_than_the_partition_offers_is_one_line(tmp_path, tiny_data_dir, cluster):
    """Checked against the partition's nodes (sinfo GRES), not this host, which has none."""
    repo = init_repo(tmp_path / "repo", {"train.py": gpu_train(1.0)})
    base = ("run", "--budget", "2", "--proposer", "queue", "--command", f"{sys.executable} train.py",
            "--executor", "slurm", "--gpus-per-trial")
    proc = autoloop(repo, *base, "8", "--slurm-partition", GPU_PARTITION, data_dir=tiny_data_dir,
                    env={"AUTOLOOP_DEVICE": ""})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    said = f"--gpus-per-trial 8: partition {GPU_PARTITION} has up to 4 per node (sinfo GRES)"
    assert said in proc.stderr, proc.stderr
    proc = autoloop(repo, *base, "2", data_dir=tiny_data_dir, env={"AUTOLOOP_DEVICE": ""})
    assert proc.returncode != 0 and "--gpus-per-trial 2: the default partition has none (sinfo GRES)" in proc.stderr
    assert not cluster.queue() and not (repo / "results" / "ledger.jsonl").exists()


def test_one_state_query_answers_for_every_workers_job(cluster):
    """The watcher all workers share asks squeue once per update for all their jobs."""
    from autoloop.execution.executors.slurm_state import QuietWatcher

    ids = [cluster.run("sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true").strip() for _ in range(2)]
    watcher = QuietWatcher(delay_s=60)
    for job_id in [*ids, "999999"]:
        watcher.register_job(job_id)
    watcher.update()
    assert watcher.calls == 1
    assert [watcher.streak(i) for i in ids] == [("PENDING", 1), ("PENDING", 1)]
    assert watcher.streak("999999") == ("MISSING", 1)   # never known: no word of it


def test_doctor_asks_sbatch_test_only_with_the_nights_options(tmp_path, tiny_data_dir, cluster):
    repo = init_repo(tmp_path / "repo", {"train.py": gpu_train(1.0)})
    base = ("doctor", "--executor", "slurm", "--slurm-partition", GPU_PARTITION, "--gpus-per-trial", "2",
            "--command", f"{sys.executable} train.py")
    proc = autoloop(repo, *base, data_dir=tiny_data_dir)
    line = next((x for x in proc.stdout.splitlines() if "--test-only" in x), "")
    assert "sbatch" in line and "to start at" in line and "refused" not in line, proc.stdout
    proc = autoloop(repo, *base, "--slurm-option", "reservation=nosuch", data_dir=tiny_data_dir)
    line = next((x for x in proc.stdout.splitlines() if "--test-only" in x), "")
    assert proc.returncode != 0 and "--test-only refused the job" in line and "eservation" in line, proc.stdout
    assert not cluster.queue()   # nothing was queued
