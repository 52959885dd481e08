"""Does a restructure leave what a night writes unchanged? The same night on two checkouts.

Runs one scripted night through each checkout's own CLI (``PYTHONPATH`` set to it): a queue
of patches on a stand-in train.py whose metric is a function of its constants, so every
verdict is known (a keep, a discard, a trivial crash, a within-noise gain confirmed, the same
change again), then ``status``, ``status --json``, ``report`` and ``attempts --json``. It
compares what a person or a tool reads: the file names under results/, every ledger record's
keys, statuses, crash classes, reasons and ``extra`` keys, results.tsv's header and rows, the
git refs, and the commands' text, with what differs by nature masked (commit hashes, clock
times, durations, the temporary paths). Prints each difference, or that there is none.

    python benchmarks/same_night.py OLD_CHECKOUT NEW_CHECKOUT
    python benchmarks/same_night.py /tmp/old .          # e.g. a `git worktree add /tmp/old HEAD~3`
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STAND_IN = '''\
LR = 1.0
# -- one constant a line, so that patches of different constants merge --
WD = 1.0
# ----------------------------------------------------------------------
BROKEN = False
if BROKEN:
    raise NameError("an edit's typo")
print(f"val_bpb: {LR * 0.5 + WD * 0.5:.6f}")
'''
# (file name, the constant's line as the patch leaves it): their verdicts are fixed by the metric.
PATCHES = [
    ("01_lower_lr.py", "LR = 1.0", "LR = 0.8"),        # 0.9: a keep
    ("02_raise_wd.py", "WD = 1.0", "WD = 1.4"),        # worse: a discard
    ("03_typo.py", "BROKEN = False", "BROKEN = True"),  # NameError: a trivial crash (the queue cannot fix)
    ("04_lower_wd.py", "WD = 1.0", "WD = 0.6"),        # 0.7: a keep
    ("05_lower_lr_again.py", "LR = 1.0", "LR = 0.8"),  # already in the best: no change, a skip
]
# A coding agent as a real executable: reads its prompt on stdin, lowers WD a little more on each
# trial, describes the change. Its prompts (results/agents/*.prompt.md) are compared too.
AGENT = '''\
import os, pathlib, re, sys
sys.stdin.read()
trial = int(os.environ["AUTOLOOP_TRIAL"])
target = pathlib.Path("train.py")
target.write_text(re.sub(r"^WD = .*$", f"WD = {1.0 - 0.1 * trial:.1f}", target.read_text(), count=1, flags=re.M))
pathlib.Path(os.environ["AUTOLOOP_DESCRIPTION_FILE"]).write_text(f"wd to {1.0 - 0.1 * trial:.1f}")
'''
MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:?\d\d)?"), "<stamp>"),
    (re.compile(r"\d{8}T\d{6}Z?"), "<stamp>"),
    (re.compile(r"\b1\d{9}(\.\d+)?\b"), "<stamp>"),           # seconds since the epoch
    (re.compile(r"\b\d\d:\d\d(:\d\d)?\b"), "<time>"),
    (re.compile(r"(?<![\w.])[0-9a-f]{7,64}(?!\w)"), "<sha>"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s|min|h)\b"), "<dur>"),
    (re.compile(r"\d+(\.\d+)?%"), "<n>%"),                         # shares of the night's time
    (re.compile(r'"device_busy": [\d.]+'), '"device_busy": <n>'),   # status --json's share
]
# A number is compared only where the night fixes it: a metric or a gain (six or four places,
# within the stand-in's range) or a count; times, rates and shares differ from run to run.
NUMBER = re.compile(r"(?<![\w.<])-?\d+(\.\d+)?(?![\w.>])")


def _number(match: re.Match[str]) -> str:
    text, places = match.group(0), len(match.group(1) or ".")-1
    if (places == 0 and abs(int(text)) < 100) or (places in (4, 6) and abs(float(text)) < 10):
        return text
    return "<n>"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "train.py").write_text(STAND_IN)
    (root / ".gitignore").write_text("results/\nworktrees/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "add", "-A")
    git(root, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "start")
    queue = root / "results" / "queue"
    queue.mkdir(parents=True)
    for name, old, new in PATCHES:
        (queue / name).write_text(STAND_IN.replace(old, new))


def cli(checkout: Path, repo: Path, data_dir: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "AUTOLOOP_DATA_DIR": str(data_dir), "AUTOLOOP_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)
    return f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"


def night(checkout: Path, work: Path, data_dir: Path) -> dict[str, str]:
    """Everything the night left that is compared, each as text."""
    repo = work / "repo"
    make_repo(repo)
    out = {"run": cli(checkout, repo, data_dir, "run", "--budget", "1", "--timeout", "60", "--proposer", "queue",
                      "--tag", "same", "--device", "cpu", "--command", f"{sys.executable} train.py",
                      "--noise-runs", "1", "--no-machine-probe", "--sanity-bound", "0")}
    for name, args in {"status": ["status"], "status --json": ["status", "--json"], "report": ["report"],
                       "attempts --json": ["attempts", "--json"]}.items():
        out[name] = cli(checkout, repo, data_dir, *args)
    agent_repo = work / "agent-repo"
    make_repo(agent_repo)
    (work / "agent.py").write_text(AGENT)
    out["agent night"] = cli(checkout, agent_repo, data_dir, "run", "--budget", "1", "--timeout", "60",
                             "--agent-cmd", f"{sys.executable} {work / 'agent.py'}", "--max-trials", "3",
                             "--tag", "agent", "--device", "cpu", "--command", f"{sys.executable} train.py",
                             "--noise-runs", "0", "--no-machine-probe", "--sanity-bound", "0", "--lookahead", "0")
    for prompt in sorted((agent_repo / "results" / "agents").glob("*.prompt.md")):
        out[f"agent prompt {prompt.name}"] = prompt.read_text()
    results = repo / "results"
    out["files under results/"] = "\n".join(sorted(str(p.relative_to(results)) for p in results.rglob("*")))
    out["report.md"] = (results / "report.md").read_text() if (results / "report.md").exists() else "(none)"
    records = [json.loads(line) for line in (results / "ledger.jsonl").read_text().splitlines()]
    out["ledger"] = "\n".join(json.dumps({
        "keys": list(r), "extra keys": sorted(r.get("extra") or {}), "trial": r["trial"], "attempt": r["attempt"],
        "kind": r["kind"], "status": r["status"], "crash": r.get("crash"), "reason": r.get("reason"),
        "description": r.get("description"), "metric": r.get("metric"), "best_metric": r.get("best_metric"),
        "next": r.get("next")}) for r in records)
    out["results.tsv"] = (results / "results.tsv").read_text()
    out["refs"] = git(repo, "for-each-ref", "--format=%(refname)")
    return out


def masked(text: str, work: Path) -> list[str]:
    text = text.replace(str(work), "<work>")
    for pattern, stand_in in MASKS:
        text = pattern.sub(stand_in, text)
    # The inputs snapshot's pristine copies are named by content hash, and the trials' private
    # copy of the harness (.harness/autoloop/) is the package itself: a move inside it shows there.
    lines = [line for line in text.splitlines() if not line.startswith((".pristine/blobs/", ".harness/autoloop/"))]
    return [NUMBER.sub(_number, line) for line in lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the checkout before the change")
    parser.add_argument("new", type=Path, help="the checkout after it")
    args = parser.parse_args()
    sides = {}
    with tempfile.TemporaryDirectory(prefix="autoloop-same-night-") as tmp:
        data_dir = Path(tmp) / "data"
        cli(args.old.resolve(), Path(tmp), data_dir, "prepare")   # once: both nights find it prepared
        for label, checkout in (("old", args.old.resolve()), ("new", args.new.resolve())):
            work = Path(tmp) / label
            sides[label] = {name: masked(text, work) for name, text in night(checkout, work, data_dir).items()}
            print(f"{label}: {checkout}: {len(sides[label]['ledger'])} records", flush=True)
    differences = 0
    for name in sides["old"]:
        diff = list(difflib.unified_diff(sides["old"][name], sides["new"].get(name, []), f"old {name}",
                                         f"new {name}", lineterm="", n=1))
        if diff:
            differences += 1
            print("\n".join(diff))
        else:
            print(f"same: {name} ({len(sides['old'][name])} lines)")
    print(f"{differences} of {len(sides['old'])} compared outputs differ")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
