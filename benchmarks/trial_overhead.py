"""What a trial pays around its training: train.py at a short budget, before and after a change.

Runs each given train.py (default: this checkout's) as the harness runs a trial (its own
process, AUTOLOOP_BUDGET_S, AUTOLOOP_RESULT, the prepared data), interleaved over
``--repeats``, and prints per run: the process's wall time, the training seconds it
reported, the evaluation's seconds (result file), start-up before main() (wall minus
train.py's total_seconds: interpreter and imports) and everything outside the training
(wall minus training_seconds). A side ``FILE:scout`` runs as a scout run does (--scout):
AUTOLOOP_AUDIT=0, the audit slice left unscored.

    python benchmarks/trial_overhead.py --budget 30                     # this train.py, full and scout
    python benchmarks/trial_overhead.py old.py:full train.py:scout --budget 30

On a shared machine the figures move with its load: compare sides of one invocation only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(path: Path, scout: bool, budget: float, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        env = {**os.environ, "AUTOLOOP_BUDGET_S": str(budget), "AUTOLOOP_SEED": str(seed),
               "AUTOLOOP_RESULT": str(result), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        if scout:
            env["AUTOLOOP_AUDIT"] = "0"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(path)], cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{path} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        found = dict(re.findall(r"^(training_seconds|total_seconds):\s+([\d.]+)", proc.stdout, re.M))
        record = json.loads(result.read_text())
    training, total = float(found["training_seconds"]), float(found["total_seconds"])
    return {"wall": wall, "training": training, "eval": record.get("eval_seconds", 0.0),
            "startup": wall - total, "outside": wall - training, "audit": "audit_bpb" in record}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sides", nargs="*", default=["train.py:full", "train.py:scout"],
                   help="FILE:full or FILE:scout (default: this train.py both ways)")
    p.add_argument("--budget", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    sides = []
    for side in args.sides:
        name, _, how = side.rpartition(":") if side.endswith((":full", ":scout")) else (side, ":", "full")
        sides.append((side, Path(name).resolve(), how == "scout"))
    runs: dict[str, list[dict[str, float]]] = {s: [] for s, _, _ in sides}
    print(f"{'side':<28} {'wall':>7} {'training':>8} {'eval':>7} {'start-up':>8} {'outside':>8} audit")
    for k in range(args.repeats):
        for side, path, scout in sides:
            r = run(path, scout, args.budget, 42 + k)
            runs[side].append(r)
            print(f"{side:<28} {r['wall']:>7.1f} {r['training']:>8.1f} {r['eval']:>7.1f} {r['startup']:>8.1f} "
                  f"{r['outside']:>8.1f} {'yes' if r['audit'] else 'no'}", flush=True)
    print("mean seconds outside the training:")
    for side, rs in runs.items():
        print(f"  {side:<28} {statistics.mean(r['outside'] for r in rs):.1f} s over {len(rs)} run(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
