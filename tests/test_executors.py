"""Executors (autoloop/executors/): where a trial runs.

The slurm executor is tested through submitit's own LocalExecutor (cluster "local": every
job is a real controller and worker subprocess on this machine, as on a node) and its
DebugExecutor (in this process); sbatch itself is only inspected, never run. Jobs that die
are killed for real (SIGKILL of the worker running the trial).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, queue_file, queue_patch

from autoloop.config.loading import ConfigError, build_settings
from autoloop.core.classify import classify
from autoloop.execution import cgroups
from autoloop.execution.executors import ExecutorError, LocalExecutor, make_executor
from autoloop.execution.runner import TOKEN_VAR, RunSpec

pytest.importorskip("submitit")

from autoloop.execution.executors.slurm import SlurmExecutor

# ------------------------------------------------------------------------------ fake trials

REPORT = textwrap.dedent("""\
    import sys
    print("step 00001 (100.0%) | loss: 1.0", flush=True)
    print("---")
    print("val_bpb: 1.234500")
    """)
# Prints a progress line and waits (to be stopped or killed).
HANG = textwrap.dedent("""\
    import time
    print("step 00001 (1.0%) | loss: 9.0", flush=True)
    time.sleep(120)
    """)
# Kills the job running it (its parent: the worker that runs run_process on the node), then
# lingers as an orphan that only the executor's sweep can end.
KILL_JOB = textwrap.dedent("""\
    import os, signal, time
    print("step 00001 (1.0%) | loss: 9.0", flush=True)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(120)
    """)


def spec_for(tmp_path: Path, script: str, name: str = "1-1", timeout: float = 60) -> RunSpec:
    work = tmp_path / "ws"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(script)
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return RunSpec(command=[sys.executable, "train.py"], cwd=work, log_path=runs / f"{name}.log",
                     budget_s=1, timeout_s=timeout, sample_interval_s=0.05, grace_s=2)


def slurm(tmp_path: Path, cluster: str = "local") -> SlurmExecutor:
    return SlurmExecutor(cluster, tmp_path / "results" / "slurm", {"time": 5, "gpus_per_node": 0}, poll_s=0.1)


def token_holders(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TOKEN_VAR) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


# ------------------------------------------------------------------------------ settings and sbatch


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch) -> Path:
    """An sbatch on PATH that refuses everything: the executor may be built, nothing submitted.
    sinfo too: the private cluster a test of this session may have started must not answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "scancel", "sinfo"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\necho 'fake: no cluster here' >&2\nexit 1\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_sbatch_parameters_come_from_the_settings(tmp_path, fake_sbatch):
    settings = build_settings({"executor": "slurm", "slurm_partition": "gpu", "slurm_gpus_per_trial": 2,
                               "timeout": "10m", "budget": "5m", "slurm_time_limit": "30m",
                               "slurm_options": {"account": "proj", "mem": "64G", "cpus-per-task": 8}})
    executor = make_executor(settings, tmp_path)
    params = executor.submitit.parameters
    assert params["partition"] == "gpu" and params["gpus_per_node"] == 2 and params["time"] == 30
    assert params["account"] == "proj" and params["mem"] == "64G" and params["cpus_per_task"] == 8
    assert executor.folder == tmp_path / "results" / "slurm"
    text = executor.submitit._make_submission_file_text("python -m submitit.core._submit x", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2", "#SBATCH --time=30",
                 "#SBATCH --account=proj", "#SBATCH --mem=64G", "#SBATCH --cpus-per-task=8"):
        assert line in text, line
    # any other sbatch option passes through; setup lines and a container reach the batch script
    site = make_executor(build_settings({
        "executor": "slurm", "slurm_options": {"reservation": "night", "exclusive-user": True, "requeue": False},
        "slurm_setup": ["module load cuda/12.4", "source .venv/bin/activate"],
        "slurm_container": "apptainer:/images/torch.sif", "gpus_per_trial": 2, "slurm_cpus_per_gpu": 6,
        "slurm_mem_per_gpu": "64g"}), tmp_path)
    text = site.submitit._make_submission_file_text(site.submitit._submitit_command_str, "uid")
    lines = text.splitlines()
    for line in ("#SBATCH --reservation=night", "#SBATCH --exclusive-user", "#SBATCH --cpus-per-task=12",
                 "#SBATCH --mem-per-gpu=64G", "module load cuda/12.4", "source .venv/bin/activate",
                 "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"):
        assert line in lines, (line, text)
    assert "requeue" not in text.replace("no-requeue", "")   # false: left out
    assert lines.index("module load cuda/12.4") < next(i for i, x in enumerate(lines) if x.startswith("srun "))
    assert f"apptainer exec --nv --bind {tmp_path} /images/torch.sif python3 -u -m submitit.core._submit" in text
    assert "12 CPUs, 64G per GPU, in container apptainer:/images/torch.sif" in site.plan
    whole = make_executor(build_settings({"executor": "slurm", "slurm_exclusive": True, "gpus_per_trial": 8,
                                          "slurm_container": "pyxis:nvcr.io#nvidia/pytorch:24.05-py3"}), tmp_path)
    text = whole.submitit._make_submission_file_text(whole.submitit._submitit_command_str, "uid")
    assert "#SBATCH --exclusive" in text and "#SBATCH --mem=0" in text and "cpus-per-task" not in text
    assert (f"--container-image 'nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts {tmp_path}:{tmp_path} "
            f"--container-workdir {tmp_path} python3 -u -m submitit.core._submit") in text
    # default limit: the trial timeout plus the margin, whole minutes
    default = make_executor(build_settings({"executor": "slurm", "timeout": "10m", "budget": "5m"}), tmp_path)
    assert default.submitit.parameters["time"] == 15 and "partition" not in default.submitit.parameters


def test_local_is_the_default_and_never_needs_submitit(tmp_path):
    assert isinstance(make_executor(build_settings({}), tmp_path), LocalExecutor)
    code = ("import sys; sys.modules['submitit'] = None\n"
            "from autoloop.config.loading import build_settings\n"
            "from autoloop.execution.executors import make_executor\n"
            "print(type(make_executor(build_settings({}), '.')).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "LocalExecutor"


def test_bad_executor_settings_are_one_line_errors(tmp_path, fake_sbatch, monkeypatch):
    with pytest.raises(ExecutorError,
                       match=r"^slurm_options: unknown sbatch option 'acount' \(did you mean 'account'\?\)$"):
        make_executor(build_settings({"executor": "slurm", "slurm_options": {"acount": "x"}}), tmp_path)
    with pytest.raises(ExecutorError, match="set by slurm_partition"):
        make_executor(build_settings({"executor": "slurm", "slurm_options": {"partition": "x"}}), tmp_path)
    with pytest.raises(ConfigError, match="slurm_time_limit: must be longer than the trial timeout"):
        build_settings({"executor": "slurm", "budget": 60, "slurm_time_limit": "2m"})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ExecutorError, match="sbatch and srun not found on PATH"):
        make_executor(build_settings({"executor": "slurm"}), tmp_path)
    make_executor(build_settings({"executor": "slurm", "slurm_cluster": "local"}), tmp_path)   # no sbatch needed


def test_cli_refuses_bad_slurm_settings_in_one_line(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": REPORT})
    args = ["run", "--executor", "slurm", "--slurm-cluster", "local", "--max-trials", "1", "--budget", "1",
            "--proposer", "queue"]
    proc = autoloop(repo, *args, "--slurm-option", "acount=1", data_dir=tiny_data_dir)
    assert proc.returncode == 1 and proc.stderr.strip() == ("autoloop: slurm_options: unknown sbatch option 'acount' "
                                                            "(did you mean 'account'?)"), proc.stderr
    for bad, said in ((("--slurm-container", "docker:img"), "expected pyxis:IMAGE or apptainer:IMAGE, got"),
                      (("--slurm-mem-per-gpu", "lots"), "expected a size like 64G"),
                      (("--slurm-option", "gpus=2"), "slurm_options: 'gpus' is set by gpus_per_trial"),
                      (("--slurm-option", "setup=module load x"), "'setup' is set by slurm_setup")):
        proc = autoloop(repo, *args, *bad, data_dir=tiny_data_dir)
        assert proc.returncode in (1, 2) and said in proc.stderr, (bad, proc.stderr)
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = autoloop(repo, *args, "--slurm-option", "novalue", data_dir=tiny_data_dir)
    assert proc.returncode == 2 and "expected KEY=VALUE" in proc.stderr and "Traceback" not in proc.stderr
    code = ("import sys; sys.modules['submitit'] = None\n"
            "from autoloop.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().startswith("autoloop: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "submitit" in proc.stderr


# ------------------------------------------------------------------------------ one trial


@pytest.mark.parametrize("cluster", ["local", "debug"])
def test_a_trial_as_a_job_gives_the_same_outcome_as_locally(tmp_path, cluster):
    here = LocalExecutor().run(spec_for(tmp_path, REPORT, "1-1"))
    progress, jobs, starts = [], [], []
    there = slurm(tmp_path, cluster).run(spec_for(tmp_path, REPORT, "1-2"), on_progress=progress.append,
                                         on_job=jobs.append, on_start=starts.append)
    assert there.metric == here.metric == 1.2345
    assert (there.exit_code, there.signal, there.killed_reason, there.summary) == \
           (here.exit_code, here.signal, here.killed_reason, here.summary)
    assert classify(there) == classify(here)
    assert there.job["executor"] == "slurm" and there.job["cluster"] == cluster and there.job["job_id"]
    assert jobs and jobs[0]["job_id"] == there.job["job_id"]
    assert progress and progress[-1].startswith("step 00001")
    assert "val_bpb: 1.234500" in there.log_path.read_text()   # the node wrote the usual log
    if cluster == "local":
        assert starts == [[(jobs[0]["pid"], jobs[0]["create_time"])]]   # the controller, for recovery


def test_a_job_killed_on_its_node_is_a_classified_crash_and_leaves_nothing(tmp_path):
    spec = spec_for(tmp_path, KILL_JOB)
    spec.env[TOKEN_VAR] = "token-of-the-killed-job"   # kept by the executor: the trial's processes carry it
    outcome = slurm(tmp_path).run(spec)
    verdict = classify(outcome)
    assert verdict.kind == "fundamental", verdict
    job_id = outcome.job["job_id"]
    assert verdict.reason.startswith(f"job {job_id} ended without a trial outcome"), verdict
    assert outcome.metric is None and outcome.job_error
    assert f"job {job_id}" in spec.log_path.read_text()   # the evidence is in the trial's log too
    assert not token_holders("token-of-the-killed-job")   # the orphaned trial was ended
    assert cgroups.group_of_token("token-of-the-killed-job") is None   # and its cgroup removed


def test_a_job_function_that_raises_is_a_classified_crash(tmp_path):
    spec = spec_for(tmp_path, REPORT)
    spec.log_path.mkdir()   # the node cannot open its log: run_process raises there
    outcome = slurm(tmp_path).run(spec)
    verdict = classify(outcome)
    assert verdict.kind == "fundamental"
    assert "ended without a trial outcome" in verdict.reason and "IsADirectoryError" in verdict.reason, verdict


def test_stop_event_cancels_the_job_and_ends_the_trial(tmp_path):
    spec = spec_for(tmp_path, HANG)
    stop = threading.Event()
    outcome = slurm(tmp_path).run(spec, on_progress=lambda line: stop.set(), stop_event=stop)
    assert outcome.killed_reason == "stopped" and outcome.job_error is None
    assert classify(outcome).reason == "interrupted"
    assert "stop requested" in spec.log_path.read_text()   # run_process on the node ended the tree
    assert outcome.leftover_processes == 0


def test_a_scheduler_signal_on_the_node_is_a_crash_not_a_stop(tmp_path):
    spec = spec_for(tmp_path, HANG)
    jobs: list[dict] = []

    def cancel_like_the_scheduler(line: str) -> None:
        os.kill(jobs[0]["pid"], signal.SIGTERM)   # what scancel does: SIGTERM to the job

    outcome = slurm(tmp_path).run(spec, on_progress=cancel_like_the_scheduler, on_job=jobs.append)
    verdict = classify(outcome)
    assert verdict.kind == "fundamental"
    assert verdict.reason.startswith(f"job {jobs[0]['job_id']} was ended by the scheduler")


# A job that waits in the queue: submitit's local job process starts, but (through this
# sitecustomize, on the job's PYTHONPATH) does not begin the job function for QUEUE_WAIT_S,
# as a job that Slurm keeps PENDING. The trial's log never appears meanwhile.
QUEUED_SITECUSTOMIZE = textwrap.dedent("""\
    import os, sys, time
    if "submitit.core._submit" in sys.orig_argv and os.environ.get("QUEUE_WAIT_S"):
        time.sleep(float(os.environ["QUEUE_WAIT_S"]))
    """)


@pytest.fixture
def stuck_queue(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(QUEUED_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("QUEUE_WAIT_S", "120")


def test_a_job_pending_past_the_limit_is_cancelled_and_ended_by_the_cluster(tmp_path, stuck_queue):
    # retries=0: no resubmission (tests/test_slurm_cluster.py has the one before the end).
    executor = SlurmExecutor("local", tmp_path / "results" / "slurm", {"time": 5, "gpus_per_node": 0}, poll_s=0.1,
                             pending_timeout_s=2, retries=0)
    spec = spec_for(tmp_path, REPORT)
    jobs: list[dict] = []
    started = time.monotonic()
    outcome = executor.run(spec, on_job=jobs.append)
    assert time.monotonic() - started < 60    # not the 120 s the queue would have held it
    verdict = classify(outcome)
    assert verdict.kind == "fundamental" and outcome.metric is None
    assert verdict.reason == (f"job {jobs[0]['job_id']} still waiting in the queue after 2s (state RUNNING; "
                              "slurm_pending_timeout): cancelled"), verdict.reason
    assert "slurm_pending_timeout" in spec.log_path.read_text()    # the evidence, in the trial's log
    # The queue's doing, not the change's: the engine records it as ended, not as this crash.
    assert outcome.cluster_ended == f"job {jobs[0]['job_id']} waited in the queue past slurm_pending_timeout"
    controller = jobs[0]["pid"]
    assert not psutil.pid_exists(controller) or psutil.Process(controller).status() == psutil.STATUS_ZOMBIE


def test_the_pending_limit_is_a_duration_setting(tmp_path):
    assert build_settings({"slurm_pending_timeout": "10m"}).slurm_pending_timeout == 600
    assert build_settings({"slurm_pending_timeout": 0}).slurm_pending_timeout is None   # 0: wait forever
    assert build_settings({}).slurm_pending_timeout == 3600
    with pytest.raises(ConfigError):
        build_settings({"slurm_pending_timeout": "soon"})


# ------------------------------------------------------------------------------ the loop


def fake_train(value: float, action: str = "") -> str:
    return f"VALUE = {value!r}\n" + textwrap.dedent(action) + 'print("---")\nprint(f"val_bpb: {VALUE:.6f}")\n'


def two_knob_train(a: float, b: float) -> str:
    """A train.py whose value is 1 + A + B, the two knobs far enough apart for git to merge
    a change of one onto a change of the other."""
    return (f"A = {a!r}\n\n# the knobs are apart so that their changes merge\n\nB = {b!r}\n"
            'print("---")\nprint(f"val_bpb: {1.0 + A + B:.6f}")\n')


def night(*extra: str) -> list[str]:
    return ["run", "--budget", "2", "--timeout", "25", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", "--executor", "slurm", "--slurm-cluster", "local", *extra]


def test_a_night_on_the_local_cluster(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_better.py", fake_train(0.9), "better")
    queue_file(repo, "02_dies.py", fake_train(0.5, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"),
               "kills its job")
    queue_file(repo, "03_worse.py", fake_train(1.1), "worse")
    proc = autoloop(repo, *night(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [(r["description"], r["status"]) for r in ledger] == [
        ("baseline", "keep"), ("better", "keep"), ("kills its job", "crash"), ("worse", "discard")]
    died = ledger[2]
    assert died["crash"] == "fundamental" and died["reason"].startswith(f"job {died['extra']['job_id']} ended"), died
    assert (repo / "results" / died["log_path"]).exists()
    for record in ledger:
        assert record["extra"]["executor"] == "slurm" and record["extra"]["job_id"], record
    assert ledger[-1]["best_metric"] == 0.9
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["job"] is None and state["phase"] == "stopped"


def test_two_workers_on_the_local_cluster(tmp_path, tiny_data_dir):
    """--workers 2 with --executor slurm: each worker's trials are jobs, in its own worktree."""
    # The two winning changes touch different lines, so whichever order the two workers
    # finish in, the later winner merges onto the earlier one (directly or as a replay) and the
    # night ends on both: 1.0 - 0.1 - 0.2. (Whole-file values would conflict when "best" runs
    # on the baseline while "better" is kept, and that race made the outcome timing-dependent.)
    base = two_knob_train(0.0, 0.0)
    repo = init_repo(tmp_path / "repo", {"train.py": base})
    queue_patch(repo, "01_better.patch", base, two_knob_train(-0.1, 0.0), "better")
    queue_patch(repo, "02_worse.patch", base, two_knob_train(0.1, 0.0), "worse")
    queue_patch(repo, "03_best.patch", base, two_knob_train(0.0, -0.2), "best")
    proc = autoloop(repo, *night("--workers", "2"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 workers" in proc.stdout and "no more ideas" in proc.stdout
    ledger = assert_invariants(repo)
    judged = {r["description"]: r for r in ledger if r["kind"] == "candidate"}
    assert set(judged) == {"better", "worse", "best"}
    assert judged["worse"]["status"] == "discard"
    assert ledger[-1]["best_metric"] == pytest.approx(0.7)
    assert {r["worker"] for r in ledger[1:]} <= {0, 1}
    job_ids = [r["extra"]["job_id"] for r in ledger]
    assert all(r["extra"]["executor"] == "slurm" for r in ledger) and len(set(job_ids)) == len(job_ids)
    assert {r["worker"] for r in ledger if r["kind"] == "candidate"} == {0, 1}   # both workers ran jobs
    assert not list((repo / "results").glob("state-w*.json")) and not list((repo / "worktrees").glob("w*"))


def test_recovery_cancels_the_job_of_a_killed_orchestrator(tmp_path, tiny_data_dir):
    marker = tmp_path / "started"
    hang = fake_train(0.8, f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('x')\ntime.sleep(120)\n")
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01_hang.py", hang, "hangs")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    cmd = [sys.executable, "-m", "autoloop.cli", *night("--noise-runs", "0", "--sanity-bound", "0")]
    orchestrator = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):   # until the hanging trial runs (a bound, not a timing assertion)
            if marker.exists() or orchestrator.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), "the trial never started"
        job = json.loads((repo / "results" / "state.json").read_text())["job"]
        controller = psutil.Process(job["pid"])
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait()
        assert controller.is_running()   # the job outlived its orchestrator
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
    # The subject is the orphaned job: its re-run would hang to the hard timeout.
    proc = autoloop(repo, *night("--resume", "--no-rerun-interrupted"), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recovery: cancelled local job" in proc.stdout
    assert not controller.is_running() or controller.status() == psutil.STATUS_ZOMBIE
    ledger = assert_invariants(repo)
    hung = [r for r in ledger if r["description"] == "hangs"]
    assert hung and hung[0]["status"] == "crash" and hung[0]["reason"].startswith("interrupted"), ledger
    leftovers = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("AUTOLOOP_RESULT", "").startswith(str(repo)) and p.status() != psutil.STATUS_ZOMBIE:
                leftovers.append(p)
        except psutil.Error:
            continue
    assert not leftovers
