"""Do a portfolio's workers propose at once? Wall time of a 2-worker portfolio night.

A portfolio with an agent member (a scripted agent that thinks for ``--agent-s`` seconds,
then changes one constant) and the mutator, on a stand-in train.py that sleeps the budget.
With the claims' one-at-a-time lock held through every proposal (the old rule for any
proposer but the agent alone), the two workers' agent calls ran in turn; with the lock only
for proposers that are quick throughout, they overlap. Prints the wall time from the first
trial's start to the last one's end, the trials, and how many agent calls overlapped.

    python benchmarks/portfolio_claims.py                  # 8 trials, 2 workers
    python benchmarks/portfolio_claims.py --trials 12 --agent-s 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TRAIN = '''\
import os, time
LR = 0.01

WIDTH = 64

DECAY = 0.5

time.sleep(float(os.environ["AUTOLOOP_BUDGET_S"]))
print(f"val_bpb: {abs(LR - 0.02) * 10 + abs(WIDTH - 96) / 100 + abs(DECAY - 0.3):.6f}")
'''

# Thinks, then scales WIDTH by a factor unique to the call (its prompt file's name holds the
# trial), so no two proposals are the same change; logs its start and end for the overlap.
AGENT = '''\
import os, re, sys, time
from pathlib import Path
start = time.time()
time.sleep(float(sys.argv[1]))
trial = re.sub(r"\\D", "", Path(sys.argv[2]).name.split("-")[0]) or "0"
text = Path("train.py").read_text()
text = re.sub(r"^WIDTH = .*$", f"WIDTH = {64 + 3 * int(trial)}", text, count=1, flags=re.M)
Path("train.py").write_text(text)
Path(os.environ["AUTOLOOP_DESCRIPTION_FILE"]).write_text(f"width {64 + 3 * int(trial)}\\n")
with open(sys.argv[3], "a") as f:
    f.write(f"{start} {time.time()}\\n")
'''


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args], cwd=cwd,
                   check=True, capture_output=True)


def night(work: Path, args) -> dict:
    repo = work / "repo"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / ".gitignore").write_text("results/*\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    agent, calls = work / "agent.py", work / "calls.txt"
    agent.write_text(AGENT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOLOOP_DEVICE": "cpu"}
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--proposer", "portfolio", "--portfolio", args.members,
           "--agent-cmd", f"{sys.executable} {agent} {args.agent_s} {{prompt_file}} {calls}", "--skip-preflight",
           "--workers", "2", "--max-trials", str(args.trials), "--budget", str(args.budget), "--noise-runs", "0",
           "--lookahead", "0", "--sanity-bound", "0", "--tag", "bench", "--device", "cpu",
           "--command", f"{sys.executable} train.py"]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the night failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-400:]}")
    records = [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]
    trials = [r for r in records if r["trial"] > 0]
    spans = [tuple(map(float, line.split())) for line in calls.read_text().splitlines()] if calls.exists() else []
    overlapping = sum(1 for i, (a, b) in enumerate(spans) for c, d in spans[i + 1:] if a < d and c < b)
    return {"wall": max(r["ended_at"] for r in trials) - min(r["started_at"] for r in trials),
            "trials": len({r["trial"] for r in trials}), "agent_calls": len(spans), "overlapping": overlapping}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--members", default="agent,queue",
                    help="the portfolio (default agent,queue: the queue is empty, so every trial is the agent's)")
    ap.add_argument("--agent-s", type=float, default=3.0, help="how long the scripted agent thinks per call")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="autoloop-claims-") as tmp:
        t0 = time.time()
        got = night(Path(tmp), args)
    print(f"portfolio {args.members}, 2 workers, {args.trials} trials, budget {args.budget:g} s, "
          f"agent {args.agent_s:g} s per call")
    print(f"trials recorded: {got['trials']}, agent calls: {got['agent_calls']}, "
          f"pairs of agent calls that overlapped: {got['overlapping']}")
    print(f"wall time of the trials: {got['wall']:.1f} s (whole run {time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
