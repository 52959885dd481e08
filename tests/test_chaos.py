"""benchmarks/chaos.py in small: every fault it knows injected once into a short night of
scripted trials (real orchestrator processes, real kills, the write faults through
AUTOLOOP_FAULT_WRITE); nothing recorded may be lost, duplicated or judged again.

The full night (400 attempts) stays a benchmark (docs/failures.md). Here each cycle runs 3-5
trials (--cycle-trials) instead of 6-14: the twelve faults, their cycles and resumes are the
subject, the trials between them only fill the ledger (seed 5 on a loaded 2-core machine:
wall 137 s at 6-14, 93 s at 3-5, with all four write faults firing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_small_night_of_every_fault_loses_nothing(tiny_data_dir):
    faults = ["kill9", "kill_trial", "enospc_ledger", "eio_tsv", "index_lock", "agent_crash", "agent_garbage",
              "agent_hang", "full_disk", "eio_ledger", "enospc_tsv", "clock_jump"]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--attempts", "20", "--seed", "5",
                           "--faults", ",".join(faults), "--cycle-trials", "3-5",
                           "--data-dir", str(tiny_data_dir)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
                          check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "records lost: 0" in out and "records duplicated: 0" in out, out
    assert "attempts whose verdict changed across a resume: 0" in out, out
    for fault in faults:   # each injected (or, where the machine lacks it, said to be skipped)
        assert f"  {fault} " in out, out
    for fault in ("enospc_ledger", "eio_ledger", "enospc_tsv", "eio_tsv"):   # and the write faults fired
        assert re.search(rf"^cycle \d+ \(workers \d\) {fault}: survived \(autoloop: the disk refused a write",
                         out, re.M), out


def test_an_unknown_fault_is_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--faults", "meteor"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "unknown fault meteor" in done.stderr and "Traceback" not in done.stderr
