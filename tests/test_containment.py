"""Containment (autoloop.execution.cgroups): each run in a cgroup of its own, where the machine allows.

Real cgroups, real processes: a daemon that calls setsid, double-forks and clears its
environment is invisible to session, token and tree tracking; only its cgroup holds it.
On a machine without a writable cgroup hierarchy the cgroup tests are skipped (and say
so); the fallback is today's tracking, tested in tests/test_runner.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from autoloop.execution import cgroups, procs
from autoloop.execution.runner import TOKEN_VAR, RunSpec, run_process

SCRIPTS = Path(__file__).parent / "trial_scripts"
CONTAINMENT, SAYS = cgroups.containment()
needs_cgroups = pytest.mark.skipif(CONTAINMENT is None, reason=f"no writable cgroup here: {SAYS}")

# A process that keeps forking children (a fork storm in miniature), to be ended whole.
FORKER = ("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        time.sleep(120)\n        os._exit(0)\n"
          "time.sleep(120)\n")


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_containment_in_force_is_named():
    assert SAYS and "\n" not in SAYS
    if CONTAINMENT is None:
        assert SAYS.startswith("process tracking")
    else:
        assert SAYS.startswith(("cgroup v2", "cgroup v1")) and str(CONTAINMENT.parent) in SAYS


@needs_cgroups
def test_an_escaping_daemon_is_ended_with_its_run(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    spec = RunSpec(command=[sys.executable, str(SCRIPTS / "escaping_daemon.py"), str(pid_file)], cwd=tmp_path,
                     log_path=tmp_path / "runs" / "1-1.log", timeout_s=60.0, grace_s=1.0, sample_interval_s=0.05)
    token = uuid.uuid4().hex   # the run's group is autoloop-<token>: checked by name, not by
    spec.env[TOKEN_VAR] = token   # counting groups (another suite on this machine makes its own)
    outcome = run_process(spec)
    daemon = int(pid_file.read_text())
    assert outcome.exit_code == 0
    assert dead(daemon), "the daemon outlived its run"
    assert outcome.leftover_processes >= 1
    assert not (CONTAINMENT.parent / f"{cgroups.GROUP_PREFIX}{token}").exists(), "the run's cgroup was left behind"


@pytest.mark.parametrize("kind", ["cgroup2", "freezer", "pids"])
def test_every_kind_of_group_ends_a_forking_tree(kind):
    """Each containment this machine offers (v2, v1 freezer, v1 pids), for real."""
    where = next((c for c in cgroups._candidates() if c.kind == kind), None)
    if where is None or cgroups._probe(where) is not None:
        pytest.skip(f"no writable {kind} hierarchy on this machine")
    group = cgroups.RunGroup(where, uuid.uuid4().hex)
    proc = subprocess.Popen([sys.executable, "-c", FORKER], preexec_fn=group.join, start_new_session=True)
    deadline = time.monotonic() + 30
    while len(group.pids()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = group.pids()
    assert len(members) == 6 and proc.pid in members, members   # the parent and its 5 children
    assert group.end() == 6
    proc.wait(timeout=10)
    assert all(dead(pid) for pid in members)
    assert not group.path.exists()


@needs_cgroups
def test_recovery_ends_the_group_of_a_run_left_by_a_kill(tmp_path):
    """kill -9 of the orchestrator: the run's cgroup outlives it, with the daemon; recovery
    finds it by the run's token and ends it."""
    token = uuid.uuid4().hex
    group = cgroups.RunGroup(CONTAINMENT, token)
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=group.join,
                              start_new_session=True, env={})
    assert procs.end_leftovers([], token=token, grace_s=1.0) >= 1
    daemon.wait(timeout=10)
    assert not group.path.exists()
