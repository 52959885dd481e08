"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check, in miniature on the CPU,
so that the script waiting for a GPU cannot rot unseen (docs/gpu.md)."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def documented_figures() -> list[str]:
    """The names in the first column of docs/gpu.md's table of figures."""
    text = (REPO / "docs" / "gpu.md").read_text()
    section = text.split("## The figures it prints", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row)]


@pytest.mark.slow
def test_gpu_check_dry_run_passes_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO), "OUT": str(out)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    printed = dict(re.findall(r"^(\w+): (\S+)$", proc.stdout, re.M))
    names = documented_figures()
    assert len(names) >= 20 and "long_recompiles" in names and "gpu_check_seconds" in names
    # Every figure docs/gpu.md names is printed under that name, and kept in figures.txt alike.
    assert [n for n in names if n not in printed] == [], proc.stdout
    kept = dict(re.findall(r"^(\w+): (\S+)$", (out / "figures.txt").read_text(), re.M))
    assert {n: kept.get(n) for n in names} == {n: printed[n] for n in names}
    numbers = {n: float(printed[n]) for n in names if n.startswith(("long_", "two_ranks_", "night_trials"))}
    assert 0 < numbers["long_val_bpb"] < 8.5 and numbers["long_num_steps"] > 1
    assert math.isnan(numbers["long_mfu_percent"])   # a CPU has no bf16 peak: nan, which float() reads
    assert numbers["long_recompiles"] == 0 and numbers["long_world_size"] == 1
    assert numbers["two_ranks_world_size"] == 2 and numbers["night_trials"] == 2
    assert printed["night_stopped"] == "reached_--max-trials_1"   # a baseline and one change
    # Everything stays under $OUT: the logs, the night's results.
    for name in ("long.log", "two_ranks.log", "night.log", "night-results.tsv", "environment.txt"):
        assert (out / name).stat().st_size > 0, name
    assert proc.stdout.rstrip().endswith(f"gpu_check: done (dry run on the CPU: no GPU figures); everything in {out}")


def test_gpu_check_refuses_an_unknown_argument():
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--fast"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "usage: bash benchmarks/gpu_check.sh [--dry-run]"
