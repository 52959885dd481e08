"""What does the offline mutator find in a short night? The real loop on the real train.py.

Copies train.py and program.md into a fresh git repository in a temporary folder, runs
``autoloop run --proposer mutate`` through the real CLI for a fixed number of trials at a
short budget (the baseline first), then prints the baseline and best val_bpb, how many
trials were kept, and what they were.

    python benchmarks/search.py                       # 12 trials x 20 s
    python benchmarks/search.py --trials 6 --budget 10

The default corpus (stdlib) is used, prepared on first use; AUTOLOOP_DATA_DIR and
AUTOLOOP_DEVICE are honoured. At budgets far below the 5 minutes train.py is tuned for,
the search mostly finds what trains faster; noise between runs is a few 0.01 bpb on CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_repo(path: Path) -> None:
    path.mkdir(parents=True)
    for name in ("train.py", "program.md"):
        shutil.copy(REPO / name, path / name)
    (path / ".gitignore").write_text("results/*\n__pycache__/\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "bench@autoloop.invalid")
    git(path, "config", "user.name", "autoloop benchmark")
    git(path, "config", "commit.gpgsign", "false")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="trials after the baseline (default 12)")
    parser.add_argument("--budget", type=float, default=20.0, help="training seconds per trial (default 20)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--keep", metavar="DIR", help="run in DIR (must not exist) and keep it afterwards")
    args = parser.parse_args()

    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="autoloop-search-")
    repo = Path(args.keep) if args.keep else Path(tmp.name) / "repo"
    make_repo(repo)
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--proposer", "mutate", "--budget", f"{args.budget:g}",
           "--max-trials", str(args.trials), "--seed", str(args.seed), "--tag", "search"]
    print("$", " ".join(cmd[1:]), flush=True)
    started = time.monotonic()
    # The loop's own lines stream through, so a long run shows where it is.
    proc = subprocess.run(cmd, cwd=repo)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        print(f"autoloop exited with {proc.returncode}", file=sys.stderr)
        return proc.returncode

    ledger = [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]
    baseline = next(r for r in ledger if r["kind"] == "baseline")
    trials = [r for r in ledger if r["kind"] != "baseline"]
    kept = [r for r in trials if r["status"] == "keep"]
    best = min((r for r in ledger if r["status"] == "keep"), key=lambda r: r["metric"])
    counts = {s: sum(r["status"] == s for r in trials) for s in ("keep", "discard", "crash", "skip")}

    print()
    print(f"budget            {args.budget:g} s per trial, seed {args.seed}, {wall / 60:.1f} min in all")
    print(f"baseline val_bpb  {baseline['metric']:.6f}")
    delta = best["metric"] - baseline["metric"]
    print(f"best val_bpb      {best['metric']:.6f} ({delta:+.6f}, {100 * delta / baseline['metric']:+.2f}%)")
    print(f"trials            {len(trials)}: {counts['keep']} kept, {counts['discard']} discarded, "
          f"{counts['crash']} crashed" + (f", {counts['skip']} skipped" if counts["skip"] else ""))
    for r in kept:
        print(f"  kept #{r['trial']:<3} {r['metric']:.6f}  {r['description']}")
    for r in trials:
        if r["status"] != "keep":
            value = f"{r['metric']:.6f}" if r["metric"] is not None else f"({r['crash']})"
            print(f"  {r['status']:<7} #{r['trial']:<3} {value:>9}  {r['description']}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
