"""Trials per hour with 1 and 2 (or more) parallel workers on the same budget.

Runs `autoloop run --workers W --max-trials N --proposer mutate` through the real CLI in a
fresh temporary repository for each W, then reads the ledger: trials per hour over the span
from the first worker trial's start to the last one's end (the baseline, run before any
worker starts, is left out of the span).

Two trial kinds (``--kind``):

* ``sleep``: a fake train.py that sleeps the budget and prints a metric computed from its
  constants: no CPU contention, so it measures what the harness itself allows (ideal: W x);
* ``real``: this repository's train.py at a short budget on the CPU. The budget is wall
  clock, so W workers still finish ~W x the trials per hour, but they share the cores
  (each trial gets cores // W threads): each trial learns less in its budget.

    python benchmarks/parallel.py                       # both kinds, 1 and 2 workers, 6 trials
    python benchmarks/parallel.py --kind sleep --trials 10 --budget 3 --workers 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SLEEPER = '''\
import os, time
LR = 0.01

WIDTH = 64

DECAY = 0.5

time.sleep(float(os.environ["AUTOLOOP_BUDGET_S"]))
print(f"val_bpb: {abs(LR - 0.02) * 10 + abs(WIDTH - 96) / 100 + abs(DECAY - 0.3):.6f}")
'''


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args], cwd=cwd,
                   check=True, capture_output=True)


def make_repo(root: Path, source: str) -> None:
    root.mkdir(parents=True)
    (root / "train.py").write_text(source)
    (root / ".gitignore").write_text("results/*\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "start")


def prepare_small_data(data: Path) -> None:
    """Small validation slices: evaluation should not dominate a few-second budget."""
    subprocess.run([sys.executable, "-m", "autoloop.cli", "prepare", "--data-dir", str(data),
                    "--val-bytes", "16384", "--audit-bytes", "4096"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                os.environ.get("PYTHONPATH")]))})


def run(kind: str, workers: int, trials: int, budget: float, data: Path, tmp: Path) -> dict:
    root = tmp / f"{kind}-w{workers}"
    make_repo(root, SLEEPER if kind == "sleep" else (REPO / "train.py").read_text())
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--proposer", "mutate", "--tag", "bench",
           "--budget", f"{budget:g}", "--max-trials", str(trials), "--workers", str(workers),
           "--noise-runs", "0", "--sanity-bound", "0", "--device", "cpu"]
    if kind == "sleep":
        cmd += ["--command", f"{sys.executable} train.py"]
    env = {**os.environ, "AUTOLOOP_DATA_DIR": str(data)}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(proc.stdout + proc.stderr)
    records = [json.loads(line) for line in (root / "results" / "ledger.jsonl").read_text().splitlines()]
    work = [r for r in records if r["kind"] != "baseline"]
    span = max(r["ended_at"] for r in work) - min(r["started_at"] for r in work)
    first_attempts = len({r["trial"] for r in work})
    best = [r["best_metric"] for r in records if r["best_metric"] is not None][-1]
    return {"kind": kind, "workers": workers, "trials": first_attempts, "attempts": len(work), "span_s": span,
            "wall_s": wall, "per_hour": first_attempts / span * 3600,
            "trial_wall_s": statistics.mean(r["wall_seconds"] for r in work), "best": best,
            "replays": sum(1 for r in work if r["extra"].get("replay_of")),
            "stale": sum(1 for r in work if r["extra"].get("stale"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["sleep", "real", "both"], default="both")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    kinds = ["sleep", "real"] if args.kind == "both" else [args.kind]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        prepare_small_data(data)
        print(f"{os.cpu_count()} CPU cores; budget {args.budget:g} s; {args.trials} trials per run")
        print(f"{'kind':6} {'workers':>7} {'trials':>6} {'attempts':>8} {'span s':>7} {'trials/h':>9} "
              f"{'speed-up':>8} {'trial wall s':>12} {'replays':>7} {'stale':>5} {'best':>9}")
        for kind in kinds:
            base = None
            for w in args.workers:
                r = run(kind, w, args.trials, args.budget, data, tmp)
                base = base or r["per_hour"]
                print(f"{kind:6} {w:>7} {r['trials']:>6} {r['attempts']:>8} {r['span_s']:>7.1f} {r['per_hour']:>9.0f} "
                      f"{r['per_hour'] / base:>7.2f}x {r['trial_wall_s']:>12.2f} {r['replays']:>7} {r['stale']:>5} "
                      f"{r['best']:>9.4f}", flush=True)


if __name__ == "__main__":
    main()
