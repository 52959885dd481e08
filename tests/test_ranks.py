"""Trials over N ranks (--gpus-per-trial): the launch command, the device groups, the setting
and its old Slurm name, the failed rank's evidence, and for real on the CPU: two gloo ranks
per trial through torch.distributed.run, one rank killed mid-trial, Ctrl-C to the terminal.

The real runs use a stand-in train.py (RANK_TRAIN): two gloo ranks that all-reduce every
50 ms until rank 0's clock passes the budget, as train.py does, then rank 0 prints the
summary block. Each rank writes its pid to results/rank<r>.pid for the test to find.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.git import init_repo
from helpers.loop import read_ledger

from autoloop.config.loading import build_settings
from autoloop.core.classify import classify
from autoloop.core.errors import ConfigError, NightError
from autoloop.core.rank_failure import rank_failure
from autoloop.execution.devices import rank_group_envs, trial_device_kind
from autoloop.execution.ranks import launch_command, throughput
from autoloop.execution.runner import RunOutcome

PY = sys.executable

RANK_TRAIN = '''"""Stand-in train.py of tests/test_ranks.py: gloo ranks that stop on rank 0's clock."""
import os, time
import torch
import torch.distributed as dist

MATRIX_LR = 0.04   # nothing to train: a constant for the mutator to propose changes of

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(f"results/rank{rank}.pid", "w") as f:
    f.write(str(os.getpid()))
# RANK_HANG: train past any budget, so that only the hard timeout ends the ranks.
budget, t0 = float(os.environ["AUTOLOOP_BUDGET_S"]) * (1000 if os.environ.get("RANK_HANG") else 1), time.time()
stop = torch.zeros(1)
while True:
    stop[0] = float(rank == 0 and time.time() - t0 >= budget)
    dist.all_reduce(stop)
    if stop.item():
        break
    time.sleep(0.05)
if rank == 0:
    print("---")
    print("val_bpb:          1.250000")
    print("mfu_percent:      nan")
    print("tokens_per_sec:   1000")
    print(f"world_size:       {world}", flush=True)
dist.destroy_process_group()
'''


# ------------------------------------------------------------------------------ launch command

def test_launch_command_puts_torchs_launcher_before_the_script():
    assert launch_command([PY, "train.py"], 1) == [PY, "train.py"]
    assert launch_command([PY, "-u", "train.py", "--x"], 2) == [
        PY, "-u", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
        "--monitor-interval", "0.5", "train.py", "--x"]
    uv = launch_command(["uv", "run", "train.py"], 4)
    assert uv[:5] == ["uv", "run", "python", "-m", "torch.distributed.run"] and uv[-1] == "train.py"
    assert "4" in uv
    with pytest.raises(ConfigError, match=r"--gpus-per-trial 2 needs a command that runs a \.py script"):
        launch_command(["./run.sh"], 2)


def test_throughput_fields_from_the_summary():
    assert throughput({"tokens_per_sec": 5e5, "mfu_percent": 41.5, "world_size": 2.0}, 2) == {
        "world_size": 2, "tokens_per_s": 5e5, "mfu_percent": 41.5}
    # A crash reports nothing: the ranks launched, no figures.
    assert throughput({}, 4) == {"world_size": 4, "tokens_per_s": None, "mfu_percent": None}
    assert throughput({}, 0)["world_size"] == 1
    # train.py's nan for a device with no known peak: no MFU recorded (JSON has no nan).
    assert throughput({"tokens_per_sec": 5e5, "mfu_percent": float("nan")}, 1)["mfu_percent"] is None


# ------------------------------------------------------------------------------ devices and settings

def test_workers_split_the_gpus_into_groups_of_n(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = build_settings({"gpus_per_trial": 2, "device": "cuda"})
    envs, line = rank_group_envs(s, 3, cuda_count=8)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3", "4,5"]
    assert line == "devices: 2 GPUs per trial (0,1; 2,3; 4,5)"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    envs, _ = rank_group_envs(s, 2, cuda_count=4)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]
    with pytest.raises(NightError) as refused:
        rank_group_envs(s, 3, cuda_count=4)
    assert str(refused.value) == ("--workers 3 x --gpus-per-trial 2 needs 6 GPUs, 4 visible; pass fewer, "
                                  "or --device cpu for CPU ranks")
    listed = build_settings({"gpus_per_trial": 2, "devices": "3,1,0,2"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in rank_group_envs(listed, 2, cuda_count=0)[0]] == ["3,1", "0,2"]


def test_cpu_ranks_share_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    envs, line = rank_group_envs(build_settings({"gpus_per_trial": 4, "device": "cpu"}), 2)
    assert envs[0] == {"AUTOLOOP_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2",
                       "MKL_NUM_THREADS": "2"}
    assert "4 CPU ranks per trial (gloo)" in line


def test_slurm_gpus_per_trial_is_an_alias_with_a_note(capsys, monkeypatch):
    import autoloop.config.settings as settings_module

    monkeypatch.setattr(settings_module, "_NOTED", set())   # the note is said once per process
    old = build_settings({"slurm_gpus_per_trial": 4})
    assert old.gpus_per_trial == 4 and old.slurm_gpus_per_trial == 4
    assert "slurm_gpus_per_trial (--slurm-gpus-per-trial) is deprecated" in capsys.readouterr().err
    new = build_settings({"gpus_per_trial": 2})
    assert new.slurm_gpus_per_trial == 2   # the Slurm executor's old name reads the new setting
    assert build_settings({}).gpus_per_trial == 1


def test_gpus_per_trial_flag_and_a_bad_value(tmp_path):
    proc = subprocess.run([PY, "-m", "autoloop.cli", "run", "--gpus-per-trial", "two"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "gpus-per-trial" in (proc.stdout + proc.stderr)


# ------------------------------------------------------------------------------ the failed rank's evidence

# Logs as torch 2.13's launcher ends them (the signal case captured on this machine; the others
# in its format): a rank killed by a signal, out of memory on one rank (its traceback in the
# error file record() wrote), a NameError without record() (the rank's stderr lines only), and
# NCCL's watchdog aborting a rank that waited out a collective; and rank 1 killed while rank 0's
# gloo collective raised "Connection reset by peer" before the launcher's next poll, so that the
# launcher named rank 0 the root cause (captured on this machine with --monitor-interval 3).
LOGS = Path(__file__).parent / "rank_logs"
KILLED, OOM, NO_RECORD, NCCL_TIMEOUT, PEER_LOST = (
    (LOGS / f"{name}.log").read_text() for name in ("killed", "oom", "no_record", "nccl_timeout", "peer_lost"))


def outcome(log: str) -> RunOutcome:
    return RunOutcome(exit_code=1, log_path=Path("x.log"), log_tail=log)


@pytest.mark.parametrize(("log", "kind", "reason"), [
    (KILLED, "fundamental", "rank 1: killed by SIGKILL (likely the host out-of-memory killer)"),
    (OOM, "fundamental", "rank 1: CUDA out of memory (tried to allocate 2.00 GiB) (train.py:640)"),
    (NO_RECORD, "trivial", "rank 0: NameError: name 'y' is not defined (train.py:12)"),
    (NCCL_TIMEOUT, "fundamental", "rank 1: collective ALLREDUCE timed out (NCCL watchdog): a rank stopped taking part"),
    (PEER_LOST, "fundamental", "rank 1: killed by SIGKILL (likely the host out-of-memory killer)"),
], ids=["signal", "oom-on-one-rank", "no-error-file", "nccl-watchdog", "peer-lost-named-first"])
def test_a_failed_rank_is_judged_on_its_own_evidence(log, kind, reason):
    verdict = classify(outcome(log))
    assert (verdict.kind, verdict.reason) == (kind, reason)
    assert "ChildFailedError" not in verdict.reason


def test_rank_failure_reads_the_root_cause_not_the_other_failures():
    failure = rank_failure(KILLED)
    assert (failure.rank, failure.exit_code, failure.signal, failure.lines) == (1, -9, "SIGKILL", [])
    assert rank_failure("Traceback (most recent call last):\nValueError: x\n") is None
    # A single-process trial keeps its old classification.
    assert classify(outcome("Traceback (most recent call last):\nNameError: name 'q' is not defined\n")).reason \
        == "NameError: name 'q' is not defined"


def test_a_root_cause_that_only_lost_its_peer_gives_way_to_the_rank_that_failed():
    assert PEER_LOST.index("Failures:") < PEER_LOST.index("Root Cause") and "rank      : 0" in PEER_LOST
    failure = rank_failure(PEER_LOST)
    assert (failure.rank, failure.exit_code, failure.signal) == (1, -9, "SIGKILL")
    # With no other failure listed, the lost peer is all there is: the root cause stands.
    alone = re.sub(r"Failures:\n\[1\]:\n(?:  .*\n)+", "Failures:\n  <NO_OTHER_FAILURES>\n", PEER_LOST)
    assert "SIGKILL" not in alone
    failure = rank_failure(alone)
    assert failure.rank == 0 and any("Connection reset by peer" in line for line in failure.lines)
    # Ranks the launcher itself ended (SIGTERM) are consequences too, never the cause.
    terminated = PEER_LOST.replace("exitcode  : -9", "exitcode  : -15").replace(
        "Signal 9 (SIGKILL)", "Signal 15 (SIGTERM)")
    assert rank_failure(terminated).rank == 0


# ------------------------------------------------------------------------------ for real, on the CPU

def rank_repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo", {"train.py": RANK_TRAIN})


def run_cmd(*extra: str, budget: str) -> list[str]:
    return [PY, "-m", "autoloop.cli", "run", "--gpus-per-trial", "2", "--device", "cpu", "--budget", budget,
            "--timeout", "240", "--proposer", "mutate", "--noise-runs", "0", "--tag", "t",
            "--command", f"{shlex.quote(PY)} train.py", *extra]


def wait_for_ranks(repo: Path, proc: subprocess.Popen, timeout: float = 180) -> list[int]:
    """The pids of both ranks once both have started (gloo rendezvous done)."""
    deadline = time.monotonic() + timeout
    files = [repo / "results" / f"rank{r}.pid" for r in (0, 1)]
    while time.monotonic() < deadline:
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("the ranks never started")


def leftovers(repo: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cwd", "pid"]):
        try:
            if p.info["cwd"] == str(repo) and p.pid != os.getpid():
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_every_trial_runs_on_two_ranks(tmp_path, tiny_data_dir):
    repo = rank_repo(tmp_path)
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    proc = subprocess.run(run_cmd("--max-trials", "2", budget="1"), cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "devices: 2 CPU ranks per trial (gloo)" in proc.stdout
    ledger = read_ledger(repo)
    assert len(ledger) == 3 and all(r["world_size"] == 2 for r in ledger), ledger
    assert all(r["tokens_per_s"] == 1000 and r["mfu_percent"] is None for r in ledger if r["status"] != "crash")
    pids = [int((repo / "results" / f"rank{r}.pid").read_text()) for r in (0, 1)]
    assert len(set(pids)) == 2    # two train.py processes, the last trial's
    status = subprocess.run([PY, "-m", "autoloop.cli", "status"], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=60)
    assert "1,000 tok/s, MFU unknown peak on 2 ranks" in status.stdout, status.stdout
    assert not leftovers(repo)


@pytest.mark.slow
def test_a_killed_rank_ends_the_trial_within_seconds(tmp_path, tiny_data_dir):
    """The baseline's rank 1 gets SIGKILL mid-training: the launcher ends rank 0, the trial is a
    crash naming rank 1 and its signal, long before the 120 s budget, and nothing is left."""
    repo = rank_repo(tmp_path)
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    proc = subprocess.Popen(run_cmd("--max-trials", "1", budget="120"), cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids = wait_for_ranks(repo, proc)
        time.sleep(0.5)
        killed_at = time.time()
        os.kill(pids[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = read_ledger(repo)[0]
    assert record["status"] == "crash" and record["crash"] == "fundamental", out
    assert record["reason"].startswith("rank 1: killed by SIGKILL"), record["reason"]
    assert record["world_size"] == 2
    assert record["ended_at"] - killed_at < 15, record["ended_at"] - killed_at
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    assert not leftovers(repo)


@pytest.mark.slow
def test_ctrl_c_ends_both_ranks_and_exits_130(tmp_path, tiny_data_dir):
    repo = rank_repo(tmp_path)
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    # A group of its own, as a shell starts a job: the terminal's Ctrl-C goes to that group.
    proc = subprocess.Popen(run_cmd("--max-trials", "1", budget="120"), cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        pids = wait_for_ranks(repo, proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not leftovers(repo)
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["stop_reason"] == "stopped by SIGINT"


def test_status_and_report_show_tokens_per_second_and_mfu():
    from autoloop.review.throughput import status_lines, throughput_section
    from autoloop.store.ledger import LedgerRecord

    base = dict(started_at=0.0, ended_at=1.0, proposer="mutate", description="x", status="keep")
    records = [LedgerRecord(trial=0, **base, world_size=8, tokens_per_s=1.2e6, mfu_percent=43.21),
               LedgerRecord(trial=1, **base, tokens_per_s=5000.0),
               LedgerRecord(trial=2, **{**base, "status": "crash"})]   # a crash reports nothing
    assert status_lines(records) == ["throughput: #0 1,200,000 tok/s, MFU 43.2 % on 8 ranks; "
                                     "#1 5,000 tok/s, MFU unknown peak"]
    assert throughput_section(records)[2:] == ["| attempt | ranks | tokens/s | MFU |", "|---|---|---|---|",
                                               "| #0 | 8 | 1,200,000 | 43.2 % |",
                                               "| #1 | 1 | 5,000 | unknown peak |", ""]
    assert status_lines(records[2:]) == [] and throughput_section(records[2:]) == []


@pytest.mark.slow
def test_the_hard_timeout_ends_every_rank(tmp_path, tiny_data_dir):
    repo = rank_repo(tmp_path)
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "RANK_HANG": "1"}
    args = run_cmd("--max-trials", "1", budget="20")
    args[args.index("--timeout") + 1] = "30"
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert (repo / "results" / "ledger.jsonl").exists(), proc.stdout + proc.stderr
    record = read_ledger(repo)[0]
    assert record["crash"] == "timeout" and record["reason"] == "hard timeout 30 s exceeded", proc.stdout
    pids = [int((repo / "results" / f"rank{r}.pid").read_text()) for r in (0, 1)]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not leftovers(repo)


def test_the_device_kind_a_proposer_is_told_follows_the_slot_then_the_settings(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")   # no GPU visible: auto means the CPU
    import autoloop.execution.devices as devices
    devices._cuda_visible.cache_clear()
    assert trial_device_kind(build_settings({})) == "cpu"
    assert trial_device_kind(build_settings({"device": "cuda:1"})) == "cuda"
    # a worker of many on the CPU while the settings name a GPU
    assert trial_device_kind(build_settings({"device": "cuda"}), {"AUTOLOOP_DEVICE": "cpu"}) == "cpu"
    devices._cuda_visible.cache_clear()
