"""The orchestrator's own cost per trial, and the share of wall time spent training.

Runs `autoloop run` through the real CLI in a temporary copy of this repository's
train.py, with a queue of N small patches and a short budget, then reads the ledger:

* trial process wall time   (from launch to exit, measured by the runner)
* orchestrator time         (everything else: proposing, git, classification, ledger)
* training fraction         (sum of training_seconds / wall time of the whole run)

    python benchmarks/loop_overhead.py               # 6 trials at 5 s
    python benchmarks/loop_overhead.py --trials 10 --budget 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_repo(root: Path, trials: int) -> None:
    source = (REPO / "train.py").read_text()
    root.mkdir()
    (root / "train.py").write_text(source)
    (root / ".gitignore").write_text("results/*\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "add", "-A")
    git(root, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "start")
    queue = root / "results" / "queue"
    queue.mkdir(parents=True)
    lr = float(re.search(r"^MATRIX_LR = ([\d.]+)", source, re.M).group(1))
    for i in range(trials):
        new = lr * (0.9 + 0.02 * i)
        text = re.sub(r"^MATRIX_LR = [\d.]+", f"MATRIX_LR = {new:.5f}", source, count=1, flags=re.M)
        (queue / f"{i:03d}.py").write_text(f"# autoloop: MATRIX_LR {lr} -> {new:.5f}\n{text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--budget", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "exp"
        make_repo(root, args.trials)
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "autoloop.cli", "prepare", "--data-dir", str(data)],
                       check=True, capture_output=True)
        env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data)}
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "--proposer", "queue", "--tag", "bench",
                               "--budget", str(args.budget)], cwd=root, env=env, capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            sys.exit(proc.stdout + proc.stderr)
        records = [json.loads(line) for line in (root / "results" / "ledger.jsonl").read_text().splitlines()]
    n = len(records)
    process = sum(r["wall_seconds"] for r in records)
    training = sum(r["training_seconds"] or 0 for r in records)
    inside = sum(r["ended_at"] - r["started_at"] for r in records)
    print(f"{n} attempts (baseline + {n - 1} trials) at a {args.budget:g} s budget, {wall:.1f} s wall in all")
    print(f"  trial process wall, mean:        {process / n:7.2f} s  (python start-up, data, training, evaluation)")
    print(f"  training inside it, mean:        {training / n:7.2f} s")
    print(f"  orchestrator per trial, mean:    {(wall - process) / n:7.2f} s  (CLI start, propose, git, judge, ledger)")
    print(f"    of which inside the attempt:   {(inside - process) / n:7.2f} s  "
          "(commit, refs, classify, record, reset)")
    print(f"  training share of wall time:     {100 * training / wall:6.1f} %")
    print(f"  at a 5 m budget this overhead is {100 * (wall - process) / n / 300:.2f} % of a trial")


if __name__ == "__main__":
    main()
