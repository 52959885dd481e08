"""What the slurm executor asks sbatch for and how it reads Slurm's answers, from recorded
tool output (no cluster: tests/test_slurm_cluster.py runs the real one)."""

from __future__ import annotations

import pytest

from autoloop.config.loading import build_settings
from autoloop.execution.executors import slurm_gpus, slurm_state

pytest.importorskip("submitit")

from autoloop.execution.executors.slurm import SlurmExecutor, sbatch_parameters

SCONTROL_NODE_FAIL = ("JobId=7 JobName=autoloop UserId=root(0) JobState=NODE_FAIL Reason=NodeDown Dependency=(null) "
                      "Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 NodeList=gpu01")
SACCT_CANCELLED = "JobID|State|Reason|ExitCode|NodeList\n8|CANCELLED by 1234|None|0:15|gpu02\n"


def test_job_states_read_in_the_clusters_words():
    info = slurm_state.parse_scontrol(SCONTROL_NODE_FAIL)
    assert slurm_state.describe(info) == "NODE_FAIL (reason NodeDown)" and slurm_state.base_state(info) == "NODE_FAIL"
    acct = slurm_state.parse_sacct(SACCT_CANCELLED)
    assert slurm_state.describe(acct) == "CANCELLED by 1234 (exit 0:15)" and slurm_state.base_state(acct) == "CANCELLED"
    requeued = slurm_state.parse_scontrol("JobId=9 JobState=PENDING Reason=BeginTime Restarts=1 ExitCode=0:0")
    assert slurm_state.describe(requeued) == "PENDING (reason BeginTime, requeued 1x)"
    timeout = slurm_state.parse_scontrol("JobId=10 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15")
    assert slurm_state.describe(timeout) == "TIMEOUT (reason TimeLimit, exit 0:15)"
    assert slurm_state.describe({}) == "UNKNOWN" and slurm_state.parse_sacct("JobID|State\n") == {}


@pytest.mark.parametrize(("gres", "gpus"), [("(null)", 0), ("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8),
                                            ("nvme:1,gpu:tesla:2", 2), ("gpu:h100:4,gpu:a100:8", 8)])
def test_gpus_per_node_from_sinfo_gres(gres, gpus):
    assert slurm_gpus.gres_gpus(gres) == gpus


def test_multi_gpu_multi_node_trial_maps_to_sbatch_and_torchrun(tmp_path):
    settings = build_settings({"executor": "slurm", "slurm_cluster": "local", "slurm_gpus_per_trial": 4,
                               "nodes_per_trial": 2, "timeout": "10m", "budget": "5m"})
    params = sbatch_parameters(settings, slurm_gpus.gpus_asked(settings))
    assert params["nodes"] == 2 and params["gpus_per_node"] == 4 and params["ntasks_per_node"] == 1
    import submitit

    executor = submitit.SlurmExecutor(folder=tmp_path, max_num_timeout=0)
    executor.update_parameters(**params)
    text = executor._make_submission_file_text("python -m submitit.core._submit x", "uid")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=1"):
        assert line in text, text
    assert slurm_gpus.first_node("gpu[07-08],cpu01") in ("gpu07",)


def test_each_node_of_a_multi_node_trial_gets_its_share(tmp_path):
    from autoloop.execution.ranks import launch_command
    from autoloop.execution.runner import RunSpec

    spec = RunSpec(command=launch_command(["python", "train.py"], 4), cwd=tmp_path, log_path=tmp_path / "3-1.log",
                     result_path=tmp_path / "result.json", env={"AUTOLOOP_TRIAL_TOKEN": "abc"})
    env = {"SLURM_NODEID": "1", "SLURM_JOB_ID": "4123", "SLURM_JOB_NODELIST": "nohost-does-not-resolve"}
    second = slurm_gpus.this_node(spec, 2, env)
    port = slurm_gpus.rendezvous_port("4123")
    assert second.command == ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                              "--nproc-per-node", "4", "--master-addr", "nohost-does-not-resolve",
                              "--master-port", str(port), "--max-restarts", "0", "--monitor-interval", "0.5",
                              "train.py"]
    assert "--standalone" not in second.command   # each node's launcher meets the others', not its own
    assert second.log_path.name == "3-1.node1.log" and second.result_path.name == "result.node1.json"
    first = slurm_gpus.this_node(spec, 2, {**env, "SLURM_NODEID": "0"})
    assert first.command[first.command.index("--node-rank") + 1] == "0"
    assert first.log_path == spec.log_path and first.result_path == spec.result_path and first.env == spec.env
    assert second.env["AUTOLOOP_TRIAL_TOKEN"] not in ("", "abc")   # its runner must not end the first node's
    assert slurm_gpus.rendezvous_port("4124") != port and 20000 <= port < 30000


def test_gpu_plan_says_what_it_asks_and_why(monkeypatch):
    settings = build_settings({"executor": "slurm"})
    monkeypatch.setattr(slurm_gpus, "partition_gpus", lambda partition: 0)
    assert slurm_gpus.gpu_plan(settings, "slurm")[0] == 0
    monkeypatch.setattr(slurm_gpus, "partition_gpus", lambda partition: 8)
    gpus, why = slurm_gpus.gpu_plan(settings, "slurm")
    assert gpus == 1 and "has up to 8 per node" in why
    monkeypatch.setattr(slurm_gpus, "partition_gpus", lambda partition: None)
    assert slurm_gpus.gpu_plan(settings, "slurm") == (1, "slurm: 1 GPU per trial job (sinfo did not say whether "
                                                         "the default partition has GPUs)")
    explicit = build_settings({"executor": "slurm", "slurm_gpus_per_trial": 2})
    assert slurm_gpus.gpu_plan(explicit, "slurm")[0] == 2
    cpu_ranks = build_settings({"executor": "slurm", "gpus_per_trial": 2, "device": "cpu"})   # ranks on the CPUs
    assert slurm_gpus.gpu_plan(cpu_ranks, "slurm") == (0, "slurm: no GPU asked for: --device cpu runs the trial's "
                                                          "2 rank(s) per node on its CPUs")
    assert SlurmExecutor.from_settings(build_settings({"executor": "slurm", "slurm_cluster": "local"}), ".").plan


def test_a_gpus_share_of_the_node_from_sinfo():
    from autoloop.execution.executors.slurm_site import parse_shares
    sinfo = ("cpu*|64|256000|(null)\n"
             "gpu|128|1024000|gpu:h100:8(S:0-1)\n"
             "gpu|64|512000|gpu:a100:8\n")
    assert parse_shares(sinfo, "gpu") == (8, 64000)   # the smaller share: 64 CPUs and 500 GB over 8 GPUs
    assert parse_shares(sinfo, None) is None           # the default partition has no GPUs
    assert parse_shares("gpu|4|4000|gpu:a100:4\n", "gpu") == (1, 1000)


def test_where_a_job_ran_from_scontrol():
    info = slurm_state.parse_scontrol("JobId=3 JobName=autoloop-t-2.1 JobState=COMPLETED NodeList=gpu07 "
                                      "JOB_GRES=gpu:h100:2 Nodes=gpu07 CPU_IDs=0-15 Mem=0 GRES=")
    assert slurm_state.placement(info) == {"node": "gpu07", "gpu_model": "h100"}
    untyped = slurm_state.parse_scontrol("JobId=4 JobState=RUNNING NodeList=n1 JOB_GRES=gpu:4")
    assert slurm_state.placement(untyped) == {"node": "n1"}
    assert slurm_state.placement(slurm_state.parse_scontrol("JobId=5 JobState=PENDING NodeList=(null)")) == {}


def test_out_of_memory_is_named_as_such(monkeypatch):
    from types import SimpleNamespace

    from autoloop.execution.executors import slurm
    monkeypatch.setattr(slurm, "_job_state", lambda job, ended=False: "OUT_OF_MEMORY (exit 0:125)")
    job = SimpleNamespace(job_id="12")
    ended = slurm._scheduler_ended(job, "SIGKILL", True, {"job_id": "12"})
    assert "out of memory" in ended["job_error"] and "preemption" not in ended["job_error"], ended
    error, timed_out, state = slurm._no_outcome_error(job, RuntimeError("Job 12 killed"), None)
    assert error.startswith("job 12 ran out of memory") and not timed_out and state.startswith("OUT_OF_MEMORY")


def test_job_states_of_many_jobs_from_one_squeue_answer(monkeypatch):
    found = slurm_state.parse_squeue("12|RUNNING|None|gpu01\n13|PENDING|Priority|\n\nbad line\n")
    assert found["12"]["State"] == "RUNNING" and found["12"]["NodeList"] == "gpu01"
    assert found["13"]["Reason"] == "Priority" and set(found) == {"12", "13"}
    monkeypatch.setattr(slurm_state.shutil, "which", lambda name: None)
    assert slurm_state.read_jobs(["12"]) is None   # no squeue: no answer, which is not "the cluster forgot it"


def test_a_job_the_cluster_forgot_or_preempted_without_a_result_ends_its_wait(tmp_path, monkeypatch):
    """submitit counts PREEMPTED and UNKNOWN as not done: its wait would never end."""
    from types import SimpleNamespace

    import submitit

    from autoloop.execution.executors import resubmit, slurm
    answers = {"77": "RUNNING", "78": "RUNNING"}
    monkeypatch.setattr(slurm_state, "read_jobs", lambda ids: {i: {"State": answers[i]} for i in ids if i in answers})
    monkeypatch.setattr(slurm_state, "accounting_enabled", lambda: False)
    watcher = slurm_state.QuietWatcher(delay_s=60)
    monkeypatch.setattr(submitit.SlurmJob, "watcher", watcher)
    executor = SimpleNamespace(cluster="slurm")
    jobs = {i: SimpleNamespace(job_id=i, paths=SimpleNamespace(result_pickle=tmp_path / f"{i}.pkl")) for i in answers}
    for i in jobs:
        watcher.register_job(i)
    watcher.update()
    assert all(slurm.SlurmExecutor._gone(executor, job) is None for job in jobs.values())
    del answers["77"]            # slurmctld forgot it (MinJobAge, no accounting)
    answers["78"] = "PREEMPTED"  # ended by preemption, no result written
    watcher.update()
    assert all(slurm.SlurmExecutor._gone(executor, job) is None for job in jobs.values())   # once is not yet
    watcher.update()
    lost, preempted = slurm.SlurmExecutor._gone(executor, jobs["77"]), slurm.SlurmExecutor._gone(executor, jobs["78"])
    assert lost is not None and lost.state == "LOST" and "no longer known to the cluster" in str(lost)
    assert preempted is not None and preempted.state == "PREEMPTED"
    assert resubmit.RESUBMIT.keys() >= {"LOST", "PREEMPTED"}   # submitted again, not blamed on the candidate
    (tmp_path / "78.pkl").write_bytes(b"x")   # a result came after all: taken, not thrown away
    assert slurm.SlurmExecutor._gone(executor, jobs["78"]) is None
    assert watcher.calls == 3   # one query per update for both jobs


def test_resubmissions_wait_longer_each_time():
    from autoloop.execution.executors.resubmit import BACKOFF_MAX_S, backoff_s
    assert [backoff_s(k, 30) for k in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert backoff_s(9, 30) == BACKOFF_MAX_S and backoff_s(3, 0) == 0
