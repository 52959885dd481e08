"""Left-overs of a kill: no empty cgroup stays behind (autoloop.execution.cgroups), and an
attempt a kill interrupted while training is run again by --resume (engine.rerun).

Real processes, real kills, real cgroups where this machine lets autoloop make them (the
cgroup checks are skipped otherwise, saying why)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import BUDGET, GOOD, assert_invariants, autoloop, queue_file, read_ledger, set_constants

from autoloop.execution import cgroups
from autoloop.execution.runner import TOKEN_VAR, RunSpec, run_process

CONTAINMENT, SAYS = cgroups.containment()
needs_cgroups = pytest.mark.skipif(CONTAINMENT is None, reason=f"no writable cgroup here: {SAYS}")


def group_path(token: str) -> Path:
    assert CONTAINMENT is not None
    return CONTAINMENT.parent / f"{cgroups.GROUP_PREFIX}{token}"


def start_long_trial(repo: Path, data_dir: Path, *extra: str) -> tuple[subprocess.Popen, dict]:
    """`autoloop run --resume` on a 30 s trial 1; returns once train.py runs (its state then)."""
    queue_file(repo, "01_long.py", set_constants(GOOD, LOG_EVERY_S="1000.0"), "restore learning rates")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu"}
    args = ["run", "--budget", "30", "--proposer", "queue", "--tag", "t", "--resume", "--noise-runs", "0",
            "--sanity-bound", "0", *extra]
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state_file = repo / "results" / "state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            state = json.loads(state_file.read_text())
        except (FileNotFoundError, ValueError):
            state = {}
        log = repo / "results" / "runs" / "1-1.log"
        printed = log.exists() and "step 00001" in log.read_text(errors="replace")
        if state.get("phase") == "running" and state.get("trial") == 1 and state.get("child_pids") and printed:
            return proc, state
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("trial 1 never started")


def new_groups_of(tokens: set[str]) -> list[str]:
    return [token for token in tokens if group_path(token).exists()]


# ------------------------------------------------------------------------------ cgroups


@needs_cgroups
@pytest.mark.parametrize("victim", ["main", "child"])
def test_a_trial_killed_from_outside_leaves_no_cgroup(tmp_path, victim):
    """SIGKILL of a trial (its main process, or a child it started) by someone else: the
    run ends, and its group goes with it."""
    script = tmp_path / "trial.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "print(child.pid, flush=True)\nchild.wait()\nsys.exit(3)\n")
    token = os.urandom(16).hex()
    spec = RunSpec(command=[sys.executable, str(script)], cwd=tmp_path, log_path=tmp_path / "runs" / "1-1.log",
                     timeout_s=60.0, grace_s=1.0, sample_interval_s=0.05)
    spec.env[TOKEN_VAR] = token

    def kill_when_started(chunk: bytes) -> None:
        text = chunk.decode().split()
        if text and text[0].isdigit():
            pids = cgroups.pids_in_group(group_path(token))
            main = next(pid for pid in pids if pid != int(text[0]))
            os.kill(main if victim == "main" else int(text[0]), signal.SIGKILL)

    outcome = run_process(spec, on_output=kill_when_started)
    assert (outcome.signal == signal.SIGKILL) if victim == "main" else (outcome.exit_code == 3), outcome
    assert not group_path(token).exists(), "the killed trial's cgroup was left behind"


@needs_cgroups
@pytest.mark.slow
def test_kill_9_of_the_orchestrator_then_resume_leaves_no_cgroup(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    proc, state = start_long_trial(repo, tiny_data_dir, "--no-rerun-interrupted")
    token = state["child_token"]
    assert group_path(token).exists()
    proc.kill()
    proc.wait()
    assert cgroups.pids_in_group(group_path(token)), "the orphaned trial lives on in its group"
    resumed = autoloop(repo, "run", "--budget", BUDGET, "--proposer", "queue", "--tag", "t", "--resume",
                       "--no-rerun-interrupted", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not group_path(token).exists(), "recovery left the killed run's cgroup"
    tokens = {r["extra"].get("token") for r in read_ledger(repo)} - {None}   # none recorded: checked by name above
    assert not new_groups_of(tokens)


@needs_cgroups
def test_empty_groups_left_by_kills_are_swept_and_busy_or_new_ones_kept():
    """What no recovery reaches (a killed night never resumed): an empty group older than a
    minute goes at the next start; one with a member, or one just made, stays."""
    old_empty, fresh_empty, old_busy = (cgroups.RunGroup(CONTAINMENT, os.urandom(16).hex()) for _ in range(3))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               preexec_fn=old_busy.join, start_new_session=True)
    try:
        for group in (old_empty, old_busy):
            os.utime(group.path, (time.time() - 3600, time.time() - 3600))
        assert cgroups.sweep_empty_groups() >= 1
        assert not old_empty.path.exists()
        assert fresh_empty.path.exists() and old_busy.path.exists()
    finally:
        for group in (old_empty, fresh_empty, old_busy):
            group.end()
        sleeper.wait(timeout=10)
    assert not old_busy.path.exists() and not fresh_empty.path.exists()


# ------------------------------------------------------------------------------ re-runs


def kill_at(repo: Path, data_dir: Path, point: str, *extra: str) -> None:
    killed = autoloop(repo, "run", "--budget", BUDGET, "--proposer", "queue", "--tag", "t", "--resume", *extra,
                      data_dir=data_dir, env={"AUTOLOOP_FAULT_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr


def resume(repo: Path, data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    done = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "25", "--proposer", "queue", "--tag", "t",
                    "--resume", *extra, data_dir=data_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
@pytest.mark.parametrize("point", ["running:1", "judging:1"])
def test_an_attempt_interrupted_while_training_is_run_again_once(baselined_repo, tiny_data_dir, point):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    kill_at(repo, tiny_data_dir, point)
    done = resume(repo, tiny_data_dir)
    assert "running attempt 1.1 again: a kill interrupted it while training" in done.stdout
    trial1 = [r for r in assert_invariants(repo) if r["trial"] == 1]
    assert [(r["attempt"], r["kind"], r["status"]) for r in trial1] == [(1, "candidate", "crash"),
                                                                         (2, "candidate", "keep")]
    assert trial1[0]["reason"].startswith("interrupted") and trial1[1]["commit"] == trial1[0]["commit"]
    assert trial1[1]["extra"]["rerun_of"] == 1
    again = resume(repo, tiny_data_dir)   # nothing pending now: no second re-run
    assert "again" not in again.stdout and len(read_ledger(repo)) == len(trial1) + 1


def test_a_noise_sample_a_kill_cut_off_is_not_taken_up_again_and_again(tmp_path, tiny_data_dir):
    """A kill during the baseline's noise sample: no decision asked for that run, so there is
    nothing to take up again. It was found pending at every turn of every slot, 'running
    attempt 0.2 again' each time with nothing run, until --max-trials (a chaos night stalled)."""
    stand_in = "LR = 1.0\nprint(f'val_bpb: {LR:.6f}')\n"
    repo = init_repo(tmp_path / "repo", {"train.py": stand_in})
    night = ("run", "--budget", "1", "--timeout", "30", "--proposer", "queue", "--tag", "t", "--noise-runs", "1",
             "--command", f"{sys.executable} train.py")
    killed = autoloop(repo, *night, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "running:0.2"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    queue_file(repo, "01_lower.py", stand_in.replace("LR = 1.0", "LR = 0.5"), "lower lr")
    done = autoloop(repo, *night, "--resume", "--max-trials", "3", data_dir=tiny_data_dir, timeout=120)
    assert done.returncode == 0 and "no more ideas" in done.stdout, done.stdout + done.stderr
    assert "again" not in done.stdout, done.stdout
    ledger = assert_invariants(repo)
    assert [(r["kind"], r["status"]) for r in ledger] == [("baseline", "keep"), ("confirm", "crash"),
                                                          ("candidate", "keep")], ledger


@pytest.mark.slow
def test_a_rerun_interrupted_too_is_not_run_a_third_time(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    kill_at(repo, tiny_data_dir, "running:1")
    kill_at(repo, tiny_data_dir, "running:1.2")
    done = resume(repo, tiny_data_dir)
    assert "again" not in done.stdout
    trial1 = [r for r in assert_invariants(repo) if r["trial"] == 1]
    assert [(r["attempt"], r["status"]) for r in trial1] == [(1, "crash"), (2, "crash")]


@pytest.mark.slow
def test_no_rerun_interrupted_leaves_the_interrupted_attempt_as_it_is(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    queue_file(repo, "02_worse.py", set_constants(GOOD, HEAD_LR="0.0"), "freeze the head")
    kill_at(repo, tiny_data_dir, "running:1")
    done = resume(repo, tiny_data_dir, "--no-rerun-interrupted")
    assert "again" not in done.stdout
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"]) for r in ledger if r["trial"] >= 1] == [(1, 1), (2, 1)]


@pytest.mark.slow
def test_rerun_with_two_workers_and_lookahead(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    for k, lr in enumerate(("0.02", "0.03", "0.04")):
        queue_file(repo, f"0{k}_lr.py", set_constants(GOOD, HEAD_LR=lr), f"head lr {lr}")
    workers = ("--workers", "2", "--lookahead", "1")
    kill_at(repo, tiny_data_dir, "running:1", *workers)
    done = resume(repo, tiny_data_dir, *workers)
    assert "running attempt 1.1 again" in done.stdout, done.stdout
    ledger = assert_invariants(repo)   # no attempt recorded twice
    # Both slots were training at the kill: each interrupted attempt is run once more, as
    # the next attempt of its trial (the look-ahead's proposal, cut off while proposing,
    # had not trained: it stays as recorded).
    cut = [r for r in ledger if (r["reason"] or "").startswith("interrupted (orchestrator stopped during running)")]
    assert cut
    for record in cut:
        reruns = [r for r in ledger if r["trial"] == record["trial"] and r["extra"].get("rerun_of")]
        assert [(r["attempt"], r["commit"], r["extra"]["rerun_of"]) for r in reruns] == [
            (record["attempt"] + 1, record["commit"], record["attempt"])], ledger
