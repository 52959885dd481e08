"""A night in miniature: the real CLI, a real git repo, real training at a 2-second budget.

The starting train.py learns almost nothing (tiny learning rates), so a queue patch
restoring the learning rates improves it by several bits per byte: a margin no machine
jitter can hide, which keeps the keep/discard verdicts deterministic.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers.git import TRAIN_PY, git, init_repo
from helpers.loop import (
    BUDGET,
    GOOD,
    REAL_TRAIN,
    SLOW,
    assert_invariants,
    autoloop,
    night_queue,
    queue_file,
    read_tsv,
    run_args,
    set_constants,
)

from autoloop.data import read_meta


@pytest.mark.slow
def test_a_night_in_miniature(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW, "program.md": "goal: low val_bpb\n"})
    start = git(repo, "rev-parse", "HEAD")
    night_queue(repo)
    proc = autoloop(repo, *run_args(), data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "has no more ideas" in proc.stdout

    ledger = assert_invariants(repo)
    rows = [(r["description"], r["status"], r["crash"]) for r in ledger]
    assert rows == [
        ("baseline", "keep", None),
        ("restore learning rates", "keep", None),
        ("freeze every weight", "discard", None),
        ("typo in the schedule", "crash", "trivial"),
        ("nan learning rate", "crash", "fundamental"),
        ("spin forever", "crash", "timeout"),
    ], proc.stdout
    assert "NameError" in ledger[3]["reason"] and "lr_multiplyer" in ledger[3]["reason"]
    assert "nan" in ledger[4]["reason"].lower()
    assert ledger[0]["commit"] == start
    assert ledger[1]["metric"] < ledger[0]["metric"] - 0.5
    assert ledger[2]["metric"] == pytest.approx(8.0, abs=1e-3)  # nothing learned: a uniform guess
    assert git(repo, "rev-parse", "HEAD") == ledger[1]["commit"]
    tsv = read_tsv(repo)
    assert [r["status"] for r in tsv] == ["keep", "keep", "discard", "crash", "crash", "crash"]
    assert [r["val_bpb"] for r in tsv][3:] == ["0.000000"] * 3
    assert (repo / "results" / "runs" / "5-1.log").exists()
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["phase"] == "stopped" and "no more ideas" in state["stop_reason"]

    status = autoloop(repo, "status", "--json", data_dir=tiny_data_dir, check=True)
    data = json.loads(status.stdout)
    assert data["best"]["commit"] == ledger[1]["commit"]
    assert data["crash_counts"] == {"trivial": 1, "fundamental": 1, "timeout": 1}


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["proposed", "committing", "committed", "running", "judging", "recorded"])
def test_sigkill_at_any_phase_then_resume(baselined_repo, tiny_data_dir, phase):
    repo = baselined_repo
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    if phase == "running":   # one case shows the loop going on after the recovery
        queue_file(repo, "02_worse.py", set_constants(GOOD, HEAD_LR="0.0", EMBED_LR="0.0", MATRIX_LR="0.0"),
                   "freeze")
    killed = autoloop(repo, *run_args(), "--resume", data_dir=tiny_data_dir,
                      env={"AUTOLOOP_FAULT_KILL_AT": f"{phase}:1"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    again = autoloop(repo, *run_args(), data_dir=tiny_data_dir)
    assert again.returncode != 0 and "--resume" in again.stderr  # no silent restart over the debris

    resumed = autoloop(repo, *run_args(), "--resume", data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = assert_invariants(repo)
    trial1 = [r for r in ledger if r["trial"] == 1]
    if phase == "recorded":
        # The verdict was on disk before the kill: it stands, nothing is run twice.
        assert [(r["status"], r["description"]) for r in trial1] == [("keep", "restore learning rates")]
    else:
        assert trial1[0]["status"] == "crash" and trial1[0]["reason"].startswith("interrupted")
        assert trial1[0]["commit"]  # the interrupted candidate is kept under its trial ref
    if phase == "running":
        assert ledger[-1]["description"] == "freeze" and ledger[-1]["status"] == "discard"


def start_long_trial(repo, data_dir) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """Start `autoloop run --resume` on a 30 s trial 1; return once its train.py is running
    and has printed its one progress line (then it is silent: a print after the
    orchestrator's death would end it by SIGPIPE, as it would a real train.py)."""
    queue_file(repo, "01_long.py", set_constants(GOOD, LOG_EVERY_S="1000.0"), "restore learning rates")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu"}
    args = ["run", "--budget", "30", "--proposer", "queue", "--tag", "t", "--resume"]
    # A process group of its own, as a shell starts a job: a terminal's signal goes to the group.
    proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    state_file = repo / "results" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            state = json.loads(state_file.read_text())
        except (FileNotFoundError, ValueError):
            state = {}
        log = repo / "results" / "runs" / "1-1.log"
        printed = log.exists() and "step 00001" in log.read_text(errors="replace")
        if state.get("phase") == "running" and state.get("trial") == 1 and state.get("child_pids") and printed:
            children = [psutil.Process(pid) for pid, _ in state["child_pids"] if psutil.pid_exists(pid)]
            if children:
                return proc, children
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("trial 1 never started")


@pytest.mark.slow
def test_external_sigkill_mid_training_leaves_no_process(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    proc, children = start_long_trial(repo, tiny_data_dir)
    proc.kill()
    proc.communicate()
    assert any(c.is_running() for c in children)  # the orphaned trial is still training

    resumed = autoloop(repo, "run", "--budget", BUDGET, "--proposer", "queue", "--tag", "t", "--resume",
                       data_dir=tiny_data_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "ended 1 process" in resumed.stdout
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    ledger = assert_invariants(repo)
    assert ledger[1]["reason"].startswith("interrupted") and ledger[1]["commit"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_or_sigterm_stops_cleanly_and_records_the_trial(baselined_repo, tiny_data_dir, sig):
    repo = baselined_repo
    proc, children = start_long_trial(repo, tiny_data_dir)
    started = time.time()
    os.killpg(proc.pid, sig)   # as a terminal (Ctrl-C) or a service manager sends it: the whole group
    out, _ = proc.communicate(timeout=60)
    assert time.time() - started < 20  # the 30 s trial was ended, not waited for
    assert proc.returncode == 128 + sig, out   # the shell's convention: 130, 143
    assert f"stopped: stopped by {sig.name}" in out
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    ledger = assert_invariants(repo)
    assert (ledger[1]["status"], ledger[1]["crash"]) == ("crash", "fundamental")
    assert ledger[1]["reason"] == f"interrupted ({sig.name})" and ledger[1]["commit"]
    state = json.loads((repo / "results" / "state.json").read_text())
    assert state["phase"] == "stopped" and state["stop_reason"] == f"stopped by {sig.name}"


@pytest.mark.slow
def test_the_real_train_py_through_the_loop(tmp_path, tiny_data_dir):
    """The real model under the harness: the private harness copy, the result file that
    autoloop.evaluate writes with the nonce, the summary block. Asserts only what holds on
    a loaded machine (a number was measured and recorded), never how much it learned."""
    repo = init_repo(tmp_path / "repo", {"train.py": REAL_TRAIN})
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "600", "--proposer", "queue", "--tag", "t",
                    "--device", "cpu", data_dir=tiny_data_dir, timeout=900)
    assert proc.returncode == 0 and "no more ideas" in proc.stdout, proc.stdout + proc.stderr
    [baseline] = assert_invariants(repo)
    assert (baseline["kind"], baseline["status"]) == ("baseline", "keep"), baseline
    assert 0 < baseline["metric"] < 12 and baseline["memory_gb"] > 0
    assert baseline["fingerprint"] == read_meta(tiny_data_dir)["fingerprint"]   # evaluated on the night's data
    log = (repo / "results" / baseline["log_path"]).read_text()
    assert "\n---\nval_bpb:" in log and "num_steps:" in log


def test_second_orchestrator_is_refused(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    from filelock import FileLock

    (repo / "results").mkdir(exist_ok=True)
    with FileLock(str(repo / "results" / ".autoloop.lock")):
        proc = autoloop(repo, *run_args(), data_dir=tiny_data_dir)
    assert proc.returncode == 1
    assert proc.stderr.strip() .startswith("autoloop: another autoloop is already running")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case,expect", [
    ("dirty", "uncommitted changes"),
    ("no_train", "train.py"),
    ("unknown_key", "unknown setting 'bugdet' (did you mean 'budget'?)"),
    ("bad_duration", "--budget: cannot read '5 minutes' as a duration"),
    ("not_a_repo", "not a git repository"),
])
def test_bad_start_is_one_clear_line(tmp_path, tiny_data_dir, case, expect):
    repo = tmp_path / "repo"
    args = run_args()
    if case == "not_a_repo":
        repo.mkdir()
    elif case == "no_train":
        init_repo(repo, {"other.py": "x = 1\n"})
    else:
        init_repo(repo, {"train.py": SLOW})
    if case == "dirty":
        (repo / "train.py").write_text(SLOW + "\n# edited\n")
    if case == "unknown_key":
        (repo / "autoloop.toml").write_text("bugdet = 10\n")
        git(repo, "add", "autoloop.toml")
        git(repo, "commit", "-qm", "config")
    if case == "bad_duration":
        args = [a if a != BUDGET else "5 minutes" for a in args]
    proc = autoloop(repo, *args, data_dir=tiny_data_dir)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expect in err[0]


@pytest.mark.slow
def test_trial_command_for_a_self_driving_agent(tmp_path, tiny_data_dir):
    # From scratch (not the template): the first call must run the baseline by itself.
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    (repo / "train.py").write_text(GOOD)
    proc = autoloop(repo, "trial", "-m", "restore learning rates", "--budget", BUDGET, "--tag", "t",
                    data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"^verdict: keep val_bpb: \d+\.\d{6} reason: improved by", last), last
    ledger = assert_invariants(repo)
    assert [(r["kind"], r["status"]) for r in ledger] == [("baseline", "keep"), ("candidate", "keep")]

    (repo / "train.py").write_text(GOOD.replace("lr_multiplier(progress)", "lr_multiplyer(progress)", 1))
    proc = autoloop(repo, "trial", "-m", "typo", "--budget", BUDGET, data_dir=tiny_data_dir)
    assert proc.returncode == 3
    assert proc.stdout.strip().splitlines()[-1].startswith("verdict: crash trivial val_bpb: - reason: NameError")
    assert_invariants(repo)
    assert (repo / "train.py").read_text() == GOOD  # back at the best


def test_init_creates_a_ready_repo(tmp_path):
    target = tmp_path / "exp"
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "init", str(target)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (target / "train.py").read_text() == TRAIN_PY.read_text()
    assert "val_bpb" in (target / "program.md").read_text()
    assert git(target, "status", "--porcelain") == ""
    assert git(target, "check-ignore", "results/ledger.jsonl") == "results/ledger.jsonl"
    again = subprocess.run([sys.executable, "-m", "autoloop.cli", "init", str(target)], capture_output=True, text=True)
    assert again.returncode == 1 and "not an empty folder" in again.stderr
