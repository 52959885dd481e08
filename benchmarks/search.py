"""Which proposer finds more in a night? Simulated landscapes, and a short night on the real train.py.

``sim`` (the default): the simulated nights of benchmarks/noise.py (a fake train.py whose
val_bpb is a known true value plus Gaussian noise, run through the real loop, git, ledger
and proposers) on its sparse and dense landscapes and on ``coupled``, where the best LR_A
depends on WIDTH_C. For each proposer, 10 nights (seeds 42..51) of up to 90 trials with the
default keep rule (noise runs, confirmations); printed per landscape: the true gain of the
best after 20, 45 and 90 runs (every run costs the same: noise samples and confirmations
included), the final true gain, keeps, false keeps (kept though the true value did not
improve), crashes, runs and wall time, and for the portfolio the share of trials each member
proposed.

    python benchmarks/search.py                          # 3 landscapes x 4 proposers x 10 nights
    python benchmarks/search.py --nights 3 --landscape coupled --proposers mutate,optuna-tpe

``real``: the real train.py in a fresh repository for each proposer, a few trials at a short
budget (the default corpus; AUTOLOOP_DATA_DIR and AUTOLOOP_DEVICE are honoured): baseline,
best, kept changes. At budgets far below the 5 minutes train.py is tuned for, the search
mostly finds what trains faster; noise between runs is a few 0.01 bpb on CPU.

    python benchmarks/search.py real                     # mutate, optuna-tpe, portfolio: 8 trials x 15 s
    python benchmarks/search.py real --proposers mutate --trials 12 --budget 20
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noise import LANDSCAPES, night

REPO = Path(__file__).resolve().parent.parent

PROPOSERS = {
    "mutate": ("--proposer", "mutate"),
    "optuna-tpe": ("--proposer", "optuna", "--sampler", "tpe"),
    "optuna-cmaes": ("--proposer", "optuna", "--sampler", "cmaes"),
    "optuna-gp": ("--proposer", "optuna", "--sampler", "gp"),
    "portfolio": ("--proposer", "portfolio", "--portfolio", "mutate,optuna"),
}
SIM_DEFAULT = "mutate,optuna-tpe,optuna-cmaes,portfolio"
REAL_DEFAULT = "mutate,optuna-tpe,portfolio"


# ------------------------------------------------------------------------------ simulated nights


def simulate(args) -> int:
    checkpoints = tuple(int(k) for k in args.checkpoints.split(","))
    names = _names(args.proposers)
    landscapes = list(LANDSCAPES) if args.landscape == "all" else [args.landscape]
    work = Path(tempfile.mkdtemp(prefix="autoloop-search-bench-"))
    started = time.monotonic()
    try:
        for landscape in landscapes:
            rows = []
            for name in names:
                nights = []
                for i in range(args.nights):
                    nights.append(night("auto", args.trials, args.sigma, 2, work, 42 + i, landscape, checkpoints,
                                        proposer=PROPOSERS[name], label=name))
                    print(f"  {landscape} {name} night {i + 1}/{args.nights}: gain@{checkpoints[-1]} "
                          f"{nights[-1]['at_runs'][checkpoints[-1]]:.4f}, {nights[-1]['wall']:.0f} s", file=sys.stderr,
                          flush=True)
                rows.append(_total(name, nights, checkpoints, args.nights))
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
            _table(landscape, rows, checkpoints, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{time.monotonic() - started:.0f} s in all")
    return 0


def _total(name: str, nights: list[dict], checkpoints: tuple[int, ...], n: int) -> dict:
    total = {k: sum(x[k] for x in nights) for k in ("keeps", "false", "gain", "runs", "wall", "crashes")}
    total["at_runs"] = {k: sum(x["at_runs"][k] for x in nights) / n for k in checkpoints}
    total["name"], total["optimum_gain"] = name, nights[0]["optimum_gain"]
    shares = Counter()
    for x in nights:
        shares.update(x["by_proposer"])
    total["shares"] = shares
    return total


def _table(landscape: str, rows: list[dict], checkpoints: tuple[int, ...], args) -> None:
    print(f"\n{landscape} landscape: sigma {args.sigma}, {args.nights} nights (seeds 42..{41 + args.nights}) of up to "
          f"{args.trials} trials, keep rule auto (2 noise runs); true gain possible {rows[0]['optimum_gain']:.4f}")
    at = "".join(f" {'gain@' + str(k):>8}" for k in checkpoints)
    print(f"{'proposer':<13}{at} {'final':>7} {'keeps':>5} {'false':>5} {'crash':>5} {'runs':>5} {'wall s':>7}  shares")
    base = next((r for r in rows if r["name"] == "mutate"), None)
    for r in rows:
        at = "".join(f" {r['at_runs'][k]:>8.4f}" for k in checkpoints)
        shares = ", ".join(f"{k} {100 * v / sum(r['shares'].values()):.0f}%" for k, v in r["shares"].most_common()) \
            if r["name"] == "portfolio" and r["shares"] else ""
        print(f"{r['name']:<13}{at} {r['gain'] / args.nights:>7.4f} {r['keeps']:>5} {r['false']:>5} {r['crashes']:>5} "
              f"{r['runs']:>5} {r['wall']:>7.1f}  {shares}")
    if base is not None and 45 in checkpoints:
        ahead = [r["name"] for r in rows if r["name"] != "mutate" and r["at_runs"][45] > base["at_runs"][45]]
        print(f"ahead of mutate at 45 runs: {', '.join(ahead) or 'none'}")
    sys.stdout.flush()   # a table at a time, also into a file


# ------------------------------------------------------------------------------ the real train.py


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


def real(args) -> int:
    results = []
    tmp = tempfile.TemporaryDirectory(prefix="autoloop-search-")
    for name in _names(args.proposers):
        repo = Path(tmp.name) / name
        make_repo(repo)
        cmd = [sys.executable, "-m", "autoloop.cli", "run", *PROPOSERS[name], "--budget", f"{args.budget:g}",
               "--max-trials", str(args.trials), "--seed", str(args.seed), "--tag", "search"]
        print("$", " ".join(cmd[3:]), flush=True)
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=repo)   # the loop's own lines stream through
        wall = time.monotonic() - started
        if proc.returncode != 0:
            print(f"autoloop exited with {proc.returncode}", file=sys.stderr)
            return proc.returncode
        ledger = [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]
        results.append((name, ledger, wall))
    print()
    print(f"the real train.py, {args.budget:g} s per trial, {args.trials} trials after the baseline, seed {args.seed}")
    print(f"{'proposer':<13} {'baseline':>9} {'best':>9} {'change':>8} {'kept':>4} {'crash':>5} {'runs':>4} {'min':>5}")
    for name, ledger, wall in results:
        baseline = next(r for r in ledger if r["kind"] == "baseline")
        best = [r["best_metric"] for r in ledger if r["best"]][-1]
        kept = [r for r in ledger
                if r["status"] == "keep" and r["kind"] != "baseline" and "noise_samples" not in r["extra"]]
        crashes = sum(r["status"] == "crash" for r in ledger)
        runs = sum(r["status"] != "skip" for r in ledger)
        print(f"{name:<13} {baseline['metric']:>9.4f} {best:>9.4f} {best - baseline['metric']:>+8.4f} {len(kept):>4} "
              f"{crashes:>5} {runs:>4} {wall / 60:>5.1f}")
    for name, ledger, _ in results:
        for r in ledger:
            if r["status"] == "keep" and r["kind"] != "baseline" and "noise_samples" not in r["extra"]:
                who = (r["extra"].get("portfolio") or {}).get("choice", r["proposer"])
                print(f"  {name}: kept #{r['trial']} {r['best_metric']:.4f} ({who}) {r['description']}")
    tmp.cleanup()
    return 0


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROPOSERS]
    if unknown:
        raise SystemExit(f"unknown proposer {unknown[0]!r} (known: {', '.join(PROPOSERS)})")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode")
    sim = sub.add_parser("sim", help="simulated landscapes (the default)")
    sim.add_argument("--nights", type=int, default=10,
                     help="nights per proposer and landscape, seeds 42.. (default 10)")
    sim.add_argument("--trials", type=int, default=90, help="trials per night at most (default 90)")
    sim.add_argument("--sigma", type=float, default=0.01, help="noise of a run (default 0.01)")
    sim.add_argument("--landscape", choices=[*LANDSCAPES, "all"], default="all")
    sim.add_argument("--proposers", default=SIM_DEFAULT, help=f"comma-separated, of {', '.join(PROPOSERS)} "
                                                              f"(default {SIM_DEFAULT})")
    sim.add_argument("--checkpoints", default="20,45,90", help="true gain after this many runs (default 20,45,90)")
    rl = sub.add_parser("real", help="a short night on the real train.py")
    rl.add_argument("--trials", type=int, default=8, help="trials after the baseline (default 8)")
    rl.add_argument("--budget", type=float, default=15.0, help="training seconds per trial (default 15)")
    rl.add_argument("--seed", type=int, default=42)
    rl.add_argument("--proposers", default=REAL_DEFAULT, help=f"comma-separated (default {REAL_DEFAULT})")
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("sim", "real", "-h", "--help"):
        argv = ["sim", *argv]
    args = ap.parse_args(argv)
    return real(args) if args.mode == "real" else simulate(args)


if __name__ == "__main__":
    sys.exit(main())
