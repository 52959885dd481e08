"""The real train.py, run as a process on CPU with a budget of a few seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import TRAIN_PY

SUMMARY_FIELDS = ["val_bpb", "training_seconds", "total_seconds", "peak_vram_mb", "mfu_percent",
                  "total_tokens_M", "num_steps", "num_params_M", "depth"]


def run_train(script: Path, env: dict, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **env, "AUTOLOOP_RESULT": str(tmp_path / "result.json")}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def parse_summary(stdout: str) -> dict[str, float]:
    lines = stdout.strip().splitlines()
    block = lines[len(lines) - 1 - lines[::-1].index("---") + 1:]
    return {k: float(v) for k, v in (re.match(r"^(\w+):\s+(\S+)$", line).groups() for line in block)}


def test_train_py_runs_within_budget_and_reports(trial_env, tmp_path):
    proc = run_train(TRAIN_PY, trial_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = parse_summary(proc.stdout)
    assert list(summary) == SUMMARY_FIELDS  # names and order as autoresearch prints them
    result = json.loads((tmp_path / "result.json").read_text())
    assert abs(result["val_bpb"] - summary["val_bpb"]) < 5e-7
    assert 0 < summary["val_bpb"] < 8.0  # better than a uniform guess after 3 seconds
    budget = float(trial_env["AUTOLOOP_BUDGET_S"])
    # Training time is the sum of whole steps, so it passes the budget by about one step (on a
    # loaded machine one step may take far longer than the average: 3 s of slack for that).
    step_time = summary["training_seconds"] / max(summary["num_steps"] - 1, 1)
    assert budget <= summary["training_seconds"] <= budget + 2 * step_time + 3.0
    assert summary["total_seconds"] >= summary["training_seconds"]
    assert summary["num_steps"] > 1 and summary["peak_vram_mb"] > 0


def test_nan_loss_fails_fast(trial_env, tmp_path):
    broken = tmp_path / "train.py"
    source = TRAIN_PY.read_text()
    assert "MATRIX_LR = " in source
    broken.write_text(re.sub(r"^MATRIX_LR = [^#\n]*", "MATRIX_LR = float('nan') ", source, count=1, flags=re.M))
    proc = run_train(broken, {**trial_env, "AUTOLOOP_BUDGET_S": "30"}, tmp_path)
    assert proc.returncode != 0
    assert re.search(r"^FAIL: loss is nan at step \d+$", proc.stdout, re.M), proc.stdout
    assert not (tmp_path / "result.json").exists()
