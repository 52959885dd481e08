"""Does a second night gain from the first? A warm-started second night against a cold one.

On benchmarks/noise.py's simulated landscapes (a fake train.py whose val_bpb is a known true
value plus Gaussian noise, run through the real loop, git, ledger and proposers), each seed
runs a first night of ``--first`` trials (tag n1), then the same second night twice from the
same starting code (tag n2, trained for ``--second`` trials, ``git checkout main`` first; with
``--start from``, on the first night's final branch, ``run --from n1``): once
as autoloop runs it by default (warm-started from the comparable first night: the mutator
tries first what n1 kept and never repeats what n1 measured on this code, Optuna's study is
seeded with n1's points re-based onto n2's baseline) and once with ``--no-warm-start`` (the
search starts cold; the duplicate gate and the digest still remember n1, as they always do).
Printed: the true gain of the second night's best over its baseline after k runs (every run
costs the same: noise samples and confirmations included), averaged over the seeds, for each
proposer, warm and cold, and the runs the duplicate gate saved by not retraining.

    python benchmarks/warm_start.py                           # dense landscape, mutate and optuna-tpe, 3 seeds
    python benchmarks/warm_start.py --landscape sparse --seeds 5 --first 40 --second 20
    python benchmarks/warm_start.py --start from              # the second nights start where the first stopped
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noise import LANDSCAPES, fake_train, git, ledger_and_truth

REPO = Path(__file__).resolve().parent.parent
PROPOSERS = {"mutate": ("--proposer", "mutate"), "optuna-tpe": ("--proposer", "optuna", "--sampler", "tpe")}


def run(repo: Path, tag: str, trials: int, seed: int, sigma: float, proposer: tuple[str, ...],
        *extra: str) -> float:
    env = {**os.environ, "BENCH_SIGMA": str(sigma), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", *proposer, "--tag", tag,
           "--command", f"{sys.executable} train.py", "--max-trials", str(trials), "--noise-runs", "2",
           "--seed", str(seed), "--sanity-bound", "0", *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{tag}: autoloop failed:\n{proc.stdout}\n{proc.stderr}")
    return time.time() - t0


def second_night(repo: Path, checkpoints: tuple[int, ...]) -> dict:
    records, tv = ledger_and_truth(repo)
    baseline = next(r for r in records if r["kind"] == "baseline")
    runs = [r for r in records if r["status"] != "skip"]
    final = [r["best"] for r in records if r["best"]][-1]
    return {"at": {k: tv(baseline["commit"]) - tv(runs[min(k, len(runs)) - 1]["best"] or baseline["commit"])
                   for k in checkpoints},
            "gain": tv(baseline["commit"]) - tv(final), "runs": len(runs),
            "saved": sum(1 for r in records if r["status"] == "skip" and r["extra"].get("earlier_night"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--landscape", default="dense", choices=sorted(LANDSCAPES))
    ap.add_argument("--proposers", default="mutate,optuna-tpe")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first", type=int, default=30, help="trials of the first night")
    ap.add_argument("--second", type=int, default=20, help="trials of each second night")
    ap.add_argument("--sigma", type=float, default=0.01)
    ap.add_argument("--checkpoints", default="5,10,20")
    ap.add_argument("--start", default="same", choices=("same", "from"),
                    help="same: both second nights start from the first night's starting code (git checkout "
                         "main); from: they start on its final branch (run --from n1)")
    args = ap.parse_args()
    checkpoints = tuple(int(k) for k in args.checkpoints.split(","))
    work = Path(tempfile.mkdtemp(prefix="autoloop-warm-bench-"))
    started = time.monotonic()
    rows = []
    try:
        for name in args.proposers.split(","):
            flags = PROPOSERS[name]
            results: dict[str, list[dict]] = {"warm": [], "cold": []}
            for i in range(args.seeds):
                seed = 42 + i
                first = work / f"{name}-{seed}-first"
                first.mkdir()
                git(first, "init", "-q", "-b", "main")
                git(first, "config", "user.email", "bench@example.com")
                git(first, "config", "user.name", "bench")
                git(first, "config", "commit.gpgsign", "false")
                (first / ".gitignore").write_text("results/*\n__pycache__/\n")
                (first / "train.py").write_text(fake_train(args.landscape))
                git(first, "add", "-A")
                git(first, "commit", "-q", "-m", "fake train.py")
                run(first, "n1", args.first, seed, args.sigma, flags)
                if args.start == "same":
                    git(first, "checkout", "-q", "main")
                start = ("--from", "n1") if args.start == "from" else ()
                for mode, extra in (("warm", ()), ("cold", ("--no-warm-start",))):
                    repo = work / f"{name}-{seed}-{mode}"
                    shutil.copytree(first, repo, symlinks=True)
                    # The second night's own seed: the same for warm and cold, not the first night's.
                    run(repo, "n2", args.second, seed + 1000, args.sigma, flags, *start, *extra)
                    results[mode].append(second_night(repo, checkpoints))
                    print(f"  {name} seed {seed} {mode}: gain@{checkpoints[-1]} "
                          f"{results[mode][-1]['at'][checkpoints[-1]]:.4f}", file=sys.stderr, flush=True)
            for mode, nights in results.items():
                n = len(nights)
                rows.append((name, mode, {k: sum(x["at"][k] for x in nights) / n for k in checkpoints},
                             sum(x["gain"] for x in nights) / n, sum(x["saved"] for x in nights),
                             sum(x["runs"] for x in nights)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = "from the same code" if args.start == "same" else "on its final branch (--from n1)"
    print(f"\n{args.landscape} landscape, sigma {args.sigma}: a first night of {args.first} trials, then a second "
          f"night of {args.second} trials {where}, warm-started or cold; {args.seeds} seeds (42..)")
    head = "".join(f" {'gain@' + str(k):>9}" for k in checkpoints)
    print(f"{'proposer':<11} {'start':<5}{head} {'final':>8} {'not rerun':>9} {'runs':>5}")
    for name, mode, at, gain, saved, runs in rows:
        print(f"{name:<11} {mode:<5}" + "".join(f" {at[k]:>9.4f}" for k in checkpoints)
              + f" {gain:>8.4f} {saved:>9} {runs:>5}")
    print(f"\n{time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
