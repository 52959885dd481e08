"""Left-overs of a kill: no empty cgroup stays behind (autoloop.execution.procs), and an
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

import psutil
import pytest

from autoloop.execution import procs
from autoloop.execution.runner import TOKEN_VAR, TrialSpec, run_trial
from helpers.loop import BUDGET, GOOD, assert_invariants, autoloop, queue_file, read_ledger, set_constants

CONTAINMENT, SAYS = procs.containment()
needs_cgroups = pytest.mark.skipif(CONTAINMENT is None, reason=f"no writable cgroup here: {SAYS}")


def group_path(token: str) -> Path:
    assert CONTAINMENT is not None
    return CONTAINMENT.parent / f"{procs.GROUP_PREFIX}{token}"


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
