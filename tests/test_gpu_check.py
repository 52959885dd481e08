"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check, in miniature on the CPU,
so that the script waiting for a GPU cannot rot unseen (docs/gpu.md)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_dry_run_passes_on_the_cpu(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    for label, ranks in (("short", 1), ("long", 1), ("two-ranks", 2)):
        assert re.search(rf"^{label}: val_bpb \d\.\d+, [\d,]+ tokens/s, MFU unknown peak, .* "
                         rf"0 recompilation\(s\), {ranks} rank\(s\)$", out, re.M), out
    assert "skipped: a dry run" in out
    assert re.search(r"stopped: reached --max-trials 3", out), out
    assert out.rstrip().endswith("gpu_check: done (dry run on the CPU: no GPU figures)")
    assert not list(tmp_path.glob("autoloop-gpu-check.*"))   # its scratch folder is gone (torch's caches stay)


def test_gpu_check_refuses_an_unknown_argument():
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--fast"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "usage: bash benchmarks/gpu_check.sh [--dry-run]"
