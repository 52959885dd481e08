"""benchmarks/bpb.py's arithmetic and its --summarize mode (no training: rows written by hand).

The fit of val_bpb against ln(steps) is what separates a slow machine's effect from the
seed's; a wrong slope or residual would mislead every #14-style comparison.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bpb.py"


def load_bpb():
    spec = importlib.util.spec_from_file_location("bpb_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_steps_fit_recovers_a_known_slope_and_residual():
    bpb = load_bpb()
    steps = [800.0, 900.0, 1000.0, 1100.0]
    noise = [0.01, -0.01, -0.01, 0.01]   # orthogonal to ln(steps) only approximately: checked below
    values = [2.0 - 0.5 * math.log(n) + e for n, e in zip(steps, noise, strict=True)]
    per_10pct, resid = bpb.steps_fit(values, steps)
    # Least squares by hand: the slope over ln(steps), then the residual sd on n - 2 dof.
    xs = [math.log(n) for n in steps]
    mx, my = sum(xs) / 4, sum(values) / 4
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sum((x - mx) ** 2 for x in xs)
    res = [y - my - slope * (x - mx) for x, y in zip(xs, values, strict=True)]
    assert per_10pct == pytest.approx(slope * math.log(1.1))
    assert slope == pytest.approx(-0.5, abs=0.05)
    assert resid == pytest.approx(math.sqrt(sum(r * r for r in res) / 2))
    assert bpb.steps_fit(values[:2], steps[:2]) is None          # below 3 runs
    assert bpb.steps_fit(values, [900.0] * 4) is None            # every run did the same steps


def test_summarize_prints_the_tables_of_a_json_file(tmp_path, tiny_data_dir):
    from autoloop.data import load_data

    fingerprint = load_data(tiny_data_dir).fingerprint
    runs = tmp_path / "runs.jsonl"
    rows = []
    for side, path, base in (("A", "/x/train.py", 1.3), ("B", "/x/port.py", 1.6)):
        for seed, steps in zip((42, 43, 44), (800, 900, 1000), strict=True):
            rows.append({"side": side, "path": path, "budget": 300.0, "seed": seed, "fingerprint": fingerprint,
                         "val_bpb": base - 0.3 * math.log(steps / 900), "num_steps": float(steps)})
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(runs)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "budget 300 s" in out and "A / B: mean ratio" in out
    line_a = next(line for line in out.splitlines() if line.strip().startswith("A train.py") and "800-1000" in line)
    assert f"{-0.3 * math.log(1.1):+.4f}" in line_a and "0.0000" in line_a   # exact fit: no residual
    # A file bpb.py did not write, and runs on other data: one line, exit non-zero.
    (tmp_path / "junk.jsonl").write_text("not json\n")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(tmp_path / "junk.jsonl")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.startswith("error: cannot read") and "Traceback" not in bad.stderr
    runs.write_text(json.dumps({**rows[0], "fingerprint": "0" * 16}) + "\n")
    other = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(runs)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "other data" in other.stderr


def test_summarize_pools_the_seed_spread_over_files(tmp_path, tiny_data_dir):
    """Two invocations on different days: each file's mean is set aside, the spread within
    each is pooled on its degrees of freedom (by hand: A sqrt((0.02 + 0.02) / 3))."""
    from autoloop.data import load_data

    fingerprint = load_data(tiny_data_dir).fingerprint
    files = []
    for day, (a_values, b_values) in enumerate((([1.0, 1.1, 1.2], [1.0, 1.2, 1.4]), ([2.0, 2.2], [2.0, 2.4]))):
        rows = [{"side": side, "path": path, "budget": 300.0, "seed": 42 + i, "fingerprint": fingerprint,
                 "val_bpb": v, "num_steps": 900.0}
                for side, path, values in (("A", "/x/train.py", a_values), ("B", "/x/port.py", b_values))
                for i, v in enumerate(values)]
        files.append(tmp_path / f"day{day}.jsonl")
        files[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(tiny_data_dir)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--summarize", *map(str, files)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("== ") == 2 and "pooled over 2 files" in out
    pooled = out[out.index("pooled over 2 files"):]
    line_a = next(line.split() for line in pooled.splitlines() if line.strip().startswith("A train.py"))
    line_b = next(line.split() for line in pooled.splitlines() if line.strip().startswith("B port.py"))
    assert float(line_a[3]) == pytest.approx(math.sqrt(0.04 / 3), abs=1e-4) and line_a[4] == "3"
    assert float(line_b[3]) == pytest.approx(math.sqrt(0.16 / 3), abs=1e-4)
    assert line_a[5] == "-"   # every run did the same steps: no residual to pool
    assert "A train.py / B port.py: pooled sd ratio 0.50" in pooled
