"""`autoloop status`: from a hand-built state (no training), and during and after a real run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from helpers.git import init_repo
from helpers.loop import GOOD, SLOW, queue_file
from helpers.night import build_night, realistic_steps

from autoloop.review.status import status_data, status_json, status_text
from autoloop.store.state import RunState, save_state

PROGRESS = "step 00123 (41.0%) | loss: 2.3450 | lrm: 1.00 | dt: 52ms | tok/sec: 78,769 | remaining: 177s"


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    return build_night(tmp_path_factory.mktemp("night"), realistic_steps(), tag="nov29")


def test_status_of_a_running_attempt(night, tmp_path):
    results = night.results
    now = time.time()
    state = RunState(tag="nov29", phase="running", pid=os.getpid(), run_started_at=now - 3600, deadline=now + 7200,
                     trial=29, attempt=1, kind="candidate", description="EMBED_LR 0.6 -> 0.8",
                     phase_started_at=now - 42, attempt_started_at=now - 45, progress=PROGRESS,
                     best=night.best, best_metric=1.0159)
    save_state(results, state)
    data = status_data(results, now=now)
    assert data["running"] is True
    assert data["current"] == {"trial": 29, "attempt": 1, "kind": "candidate", "phase": "running",
                               "description": "EMBED_LR 0.6 -> 0.8", "elapsed_s": 45.0, "phase_elapsed_s": 42.0,
                               "progress": PROGRESS, "loss": 2.345, "percent": 41.0, "alive": True}
    assert data["best"] == {"commit": night.best, "metric": 1.0159, "trial": 25,
                            "description": "MATRIX_LR 0.06 -> 0.07", "confidence": None}
    assert data["baseline"] == {"commit": night.baseline, "metric": 1.0275, "sigma": None, "runs": 1}
    assert data["improvement"] == pytest.approx(0.0116)
    assert data["status_counts"] == {"baseline": 1, "keep": 6, "discard": 16, "crash": 6, "skip": 1}
    assert data["crash_counts"] == {"fundamental": 3, "trivial": 2, "timeout": 1}
    assert data["time_left_s"] == 7200
    assert data["trials_per_hour"] > 0
    assert json.loads(status_json(data)) == data

    text = status_text(data).splitlines()
    assert text[0] == "running: #29 candidate 'EMBED_LR 0.6 -> 0.8' (running, 45s in)"
    assert text[1] == "  41% of the budget, loss 2.3450"
    assert text[2] == f"best val_bpb: 1.015900 at {night.best[:7]} (trial 25: MATRIX_LR 0.06 -> 0.07)"
    assert text[3] == f"baseline val_bpb: 1.027500 at {night.baseline[:7]} (best is 0.011600 lower, 1.13%)"
    assert text[4] == ("28 trials, 29 attempts: baseline 1, keep 6, discard 16, crash 6, skip 1 "
                       "(crashes: fundamental 3, timeout 1, trivial 2)")
    assert re.fullmatch(r"pace: \d+\.\d trials/hour", text[5])
    assert text[6] == "time left: 2h"


def test_status_after_a_kill_says_interrupted(night):
    state = RunState(tag="nov29", phase="running", pid=2 ** 22 + 12345, trial=29, attempt=2, kind="fix",
                     description="fix", attempt_started_at=time.time() - 5)
    save_state(night.results, state)
    data = status_data(night.results)
    assert data["running"] is False and data["time_left_s"] is None
    assert status_text(data).startswith("interrupted (no live orchestrator: resume with autoloop run --resume): "
                                        "#29.2 fix 'fix'")


def test_status_of_a_fresh_workspace(tmp_path):
    data = status_data(tmp_path / "results")
    assert data["attempts"] == 0 and data["current"] is None and data["best"]["commit"] is None
    assert status_text(data) == "no trials yet"


@pytest.mark.slow
def test_status_during_and_after_a_real_run(tiny_data_dir, tmp_path):
    # Its own repo (baseline included) and a generous --timeout: the check is about status,
    # and must not fail because a shared machine made start-up slow.
    repo = init_repo(tmp_path / "repo", {"train.py": SLOW})
    queue_file(repo, "01_good.py", GOOD, "restore learning rates")
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir), "AUTOLOOP_DEVICE": "cpu"}
    log = tmp_path / "run.log"     # redirected, as under nohup: no terminal
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autoloop.cli", "run", "--budget", "8", "--timeout", "120",
                                 "--proposer", "queue", "--tag", "t", "--hours", "1", "--noise-runs", "0",
                                 "--sanity-bound", "0"],
                                cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        state_file = repo / "results" / "state.json"
        deadline = time.time() + 240
        state = {}
        while time.time() < deadline and proc.poll() is None:
            try:
                state = json.loads(state_file.read_text())
            except (FileNotFoundError, ValueError):
                state = {}
            if state.get("phase") == "running" and state.get("trial") == 1:
                break
            time.sleep(0.05)
        assert state.get("phase") == "running", log.read_text()

        def status(*args):
            done = subprocess.run([sys.executable, "-m", "autoloop.cli", "status", *args], cwd=repo, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        data = json.loads(status("--json"))
        text = status()
        assert data["running"] is True and data["phase"] in ("running", "judging")
        current = data["current"]
        assert (current["trial"], current["attempt"], current["kind"]) == (1, 1, "candidate")
        assert current["description"] == "restore learning rates" and current["alive"] is True
        assert current["elapsed_s"] >= 0
        assert data["baseline"]["metric"] == data["best"]["metric"] and data["best"]["trial"] == 0
        assert data["status_counts"] == {"baseline": 1}
        assert 0 < data["time_left_s"] <= 3600
        assert text.startswith("running: #1 candidate 'restore learning rates' (")
        assert "best val_bpb: " in text and "baseline val_bpb: " in text and "time left: " in text

        # The trial's progress line reaches the state file (train.py prints one every 5 s).
        while time.time() < deadline and proc.poll() is None:
            data = status_data(repo / "results")
            if data["current"] is None or data["current"]["loss"] is not None:
                break
            time.sleep(0.1)
        if data["current"] is not None:
            assert data["current"]["loss"] > 0 and data["current"]["percent"] is not None
        assert proc.wait(timeout=240) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    data = json.loads(status("--json"))
    assert data["running"] is False and data["current"] is None and data["time_left_s"] is None
    assert data["phase"] == "stopped" and "no more ideas" in data["stop_reason"]
    assert data["best"]["trial"] == 1 and data["best"]["description"] == "restore learning rates"
    assert data["improvement"] > 0
    assert data["status_counts"] == {"baseline": 1, "keep": 1} and data["crash_counts"] == {}
    assert data["trials_per_hour"] > 0
    text = status()
    assert text.splitlines()[0].startswith("stopped: proposer 'queue' has no more ideas")
    assert "2 trials, 2 attempts: baseline 1, keep 1" in text

    out = log.read_text()
    assert "\r" not in out and "\x1b" not in out     # plain lines only without a terminal
    assert re.search(r"^\d\d:\d\d:\d\d #1 keep \d+\.\d{4} \(-\d+\.\d{4}\) restore learning rates$", out, re.M), out


def test_jobs_the_cluster_ended_are_counted_apart_from_crashes(night):
    from autoloop.review.report import crashes_section
    from autoloop.store import queries
    from autoloop.store.ledger import LedgerRecord

    retried = LedgerRecord.model_construct(status="keep", extra={"resubmitted": ["job 7: PREEMPTED",
                                                                                "job 9: NODE_FAIL"]})
    plain = LedgerRecord.model_construct(status="discard", extra={})
    assert queries.cluster_ended([retried, plain]) == 2
    assert crashes_section([retried, plain])[2].startswith("The cluster ended 2 job(s) (preempted, node failure, "
                                                           "lost, queue limit); each trial was submitted again, and")
    # Past its retries a trial is recorded as ended: counted with them, named in the report, never a crash.
    ended = LedgerRecord.model_construct(trial=4, status="ended", extra={"resubmitted": ["job 10: PREEMPTED"]})
    assert queries.cluster_ended([retried, plain, ended]) == 4
    section = crashes_section([retried, plain, ended])
    assert "; 1 trial(s) the cluster kept ending past their retries are recorded as ended (#4)" in section[2]
    assert section[4] == "None."
    data = {**status_data(night.results), "cluster_ended": 2}
    assert ("cluster ended 2 jobs (preempted, node failure, lost, queue limit): each trial submitted again, or "
            "recorded as ended past its retries; none counted against its change") in status_text(data).splitlines()
    assert status_data(night.results)["cluster_ended"] == 0
def test_more_than_one_epoch_is_a_warning_in_status_and_report(tmp_path):
    """A run that read its training bytes twice (train.py's epochs: 2.4) warns in status and the
    report, naming the command that fixes it; under one epoch nothing is said."""
    from autoloop.review.report import report_markdown
    from autoloop.store.ledger import Ledger, LedgerRecord

    ledger = Ledger(tmp_path / "results", fsync=False)
    now = time.time()
    base = dict(started_at=now, ended_at=now + 1, proposer="mutate", commit="b" * 40, metric_name="val_bpb")
    ledger.append(LedgerRecord(trial=0, kind="baseline", description="baseline", status="keep", metric=2.0,
                               metrics={"epochs": 0.4}, best="b" * 40, **base))
    quiet = status_data(tmp_path / "results")
    assert quiet["epochs_warning"] is None and "epochs" not in status_text(quiet)
    ledger.append(LedgerRecord(trial=1, parent="b" * 40, description="SEQ_LEN 128 -> 64", status="discard",
                               metric=2.1, metrics={"epochs": 2.4}, best="b" * 40, **base))
    data = status_data(tmp_path / "results")
    line = ("WARNING: 2.4 epochs over the training bytes: val_bpb ranks memorisation, not learning; a larger "
            "corpus fixes it: autoloop prepare --corpus climbmix, then autoloop run --corpus climbmix")
    assert line in status_text(data).splitlines()
    assert json.loads(status_json(data))["epochs_warning"] == line.removeprefix("WARNING: ")
    report = report_markdown(ledger.records(), {}, picture=None)
    assert f"**Warning:** {line.removeprefix('WARNING: ')}." in report
