"""Does the noise rule stop the loop from keeping noise? A simulation through the real loop.

A fake train.py (milliseconds per run) reports ``val_bpb = true_value(constants) + N(0, sigma)``
on stdout, the way a foreign ``--command`` does. ``true_value`` is a known bowl over six
constants (optimum: every constant at its OPT; how much each matters: LANDSCAPES), so for
every kept commit we know whether it truly got better. The noise of each run is drawn from a hash of (AUTOLOOP_SEED, the
train.py text, a per-workspace run counter): different for every run, reproducible for a
whole night. Everything else is real: the loop, git, the ledger, the mutate proposer.

For each landscape and keep rule it prints: keeps (changes kept, noise samples excluded),
false keeps (kept though the true value did not improve) and their rate, worse keeps (the
true value got worse), the true improvement reached (true value of the baseline minus that
of the final best) at the end and after k runs (a shorter night), trials and runs spent.

    python benchmarks/noise.py                       # both landscapes, 10 nights x up to 200 trials, sigma 0.01
    python benchmarks/noise.py --trials 50 --sigma 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_TRAIN = '''"""Fake train.py for benchmarks/noise.py: a known true value plus Gaussian noise."""
import hashlib
import math
import os
import random
from pathlib import Path

LR_A = 0.3
LR_B = 12.0
WIDTH_C = 0.02
SCALE_D = 5.0
DECAY_E = 0.004
CLIP_F = 40.0

OPT = {"LR_A": 0.08, "LR_B": 3.0, "WIDTH_C": 0.05, "SCALE_D": 5.0, "DECAY_E": 0.01, "CLIP_F": 10.0}
# How much each knob matters: see LANDSCAPES in benchmarks/noise.py.
WEIGHT = __WEIGHT__
SIGMA = float(os.environ.get("BENCH_SIGMA", "0.01"))


def true_value(values):
    return 1.0 + sum(WEIGHT[k] * math.log(values[k] / OPT[k]) ** 2 for k in OPT)


def main():
    text = Path(__file__).read_text()
    counter = Path("results") / ".bench_runs"
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    key = f"{os.environ.get('AUTOLOOP_SEED', '42')}|{hashlib.sha256(text.encode()).hexdigest()}|{n}"
    rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    value = true_value({k: globals()[k] for k in OPT}) + rng.gauss(0.0, SIGMA)
    print("---")
    print(f"val_bpb:          {value:.6f}")


if __name__ == "__main__":
    main()
'''


# sparse: three knobs matter (a x1.4 step near the optimum is worth 3-6 sigma at sigma 0.01),
#         three do not at all: as in a real train.py, many moves change nothing but the luck.
# dense:  every knob matters, most of them a little (a x1.4 step is worth 0.6-2.3 sigma):
#         the gains the noise rule must not throw away are the size of the noise.
# coupled: the best LR_A depends on WIDTH_C (it scales as 1 / WIDTH_C, as a learning rate
#         does with the width): a long diagonal valley, where moving one knob at a time
#         zigzags and moving both at once goes straight (benchmarks/search.py).
LANDSCAPES = {
    "sparse": {"LR_A": 0.5, "LR_B": 0.3, "WIDTH_C": 0.0, "SCALE_D": 0.4, "DECAY_E": 0.0, "CLIP_F": 0.0},
    "dense": {"LR_A": 0.2, "LR_B": 0.12, "WIDTH_C": 0.08, "SCALE_D": 0.15, "DECAY_E": 0.05, "CLIP_F": 0.1},
    "coupled": {"LR_A": 0.5, "LR_B": 0.3, "WIDTH_C": 0.1, "SCALE_D": 0.4, "DECAY_E": 0.0, "CLIP_F": 0.1},
}
# knob -> {other knob: c}: the knob's distance from its optimum (in log units) is shifted by
# c x the other's, so its best value moves with the other knob.
COUPLINGS = {"coupled": {"LR_A": {"WIDTH_C": 1.0}}}
_PLAIN_TRUE_VALUE = "    return 1.0 + sum(WEIGHT[k] * math.log(values[k] / OPT[k]) ** 2 for k in OPT)\n"
_COUPLED_TRUE_VALUE = (
    "    x = {k: math.log(values[k] / OPT[k]) for k in OPT}\n"
    "    couple = __COUPLE__\n"
    "    return 1.0 + sum(WEIGHT[k] * (x[k] + sum(c * x[j] for j, c in couple.get(k, {}).items())) ** 2 for k in OPT)\n"
)


def fake_train(landscape: str) -> str:
    """The fake train.py of a landscape (sparse and dense byte for byte as before: the noise
    of a run is keyed by the file's text, so the tables in docs/noise.md stay reproducible)."""
    text = FAKE_TRAIN.replace("__WEIGHT__", repr(LANDSCAPES[landscape]))
    if landscape in COUPLINGS:
        assert _PLAIN_TRUE_VALUE in text
        text = text.replace(_PLAIN_TRUE_VALUE, _COUPLED_TRUE_VALUE.replace("__COUPLE__", repr(COUPLINGS[landscape])))
    return text


def true_value_of(source: str) -> float:
    scope: dict = {"__name__": "bench"}
    exec(compile(source, "train.py", "exec"), scope)
    return scope["true_value"]({k: scope[k] for k in scope["OPT"]})


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def ledger_and_truth(repo: Path) -> tuple[list[dict], Callable[[str], float]]:
    """The night's ledger, and the true value of a commit's train.py (read from git once each)."""
    records = [json.loads(line) for line in (repo / "results" / "ledger.jsonl").read_text().splitlines()]
    truth: dict[str, float] = {}

    def tv(commit: str) -> float:
        if commit not in truth:
            truth[commit] = true_value_of(git(repo, "show", f"{commit}:train.py"))
        return truth[commit]

    return records, tv


def night(rule: str, trials: int, sigma: float, noise_runs: int, workdir: Path, seed: int = 42,
          landscape: str = "sparse", checkpoints: tuple[int, ...] = (), noise_z: float = 2.0,
          proposer: tuple[str, ...] = ("--proposer", "mutate"), label: str | None = None) -> dict:
    """One simulated night through the real CLI; ``proposer`` are the flags choosing the
    proposer (benchmarks/search.py compares them), ``label`` names the night's folder."""
    repo = workdir / f"{landscape}-{label or rule}-{seed}"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / ".gitignore").write_text("results/*\n__pycache__/\n")
    (repo / "train.py").write_text(fake_train(landscape))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fake train.py")
    env = {**os.environ, "BENCH_SIGMA": str(sigma), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", *proposer, "--tag", "bench",
           "--command", f"{sys.executable} train.py", "--max-trials", str(trials), "--keep-rule", rule,
           "--noise-runs", str(noise_runs), "--seed", str(seed), "--noise-z", str(noise_z),
           # The sanity bound (re-run a suspiciously large gain) would add the same runs to
           # both rules early in the night; off, so the table compares the keep rules alone.
           "--sanity-bound", "0"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{label or rule}: autoloop failed:\n{proc.stdout}\n{proc.stderr}")
    records, tv = ledger_and_truth(repo)
    baseline = next(r for r in records if r["kind"] == "baseline")
    keeps = [r for r in records if r["status"] == "keep" and r["kind"] != "baseline"
             and "noise_samples" not in r["extra"]]
    false = [r for r in keeps if tv(r["commit"]) >= tv(r["parent"])]
    worse = [r for r in keeps if tv(r["commit"]) > tv(r["parent"])]
    final = [r["best"] for r in records if r["best"]][-1]
    # A night is a time budget: what matters is the true value of the best after k runs
    # (every run costs the same 5 minutes: noise samples and confirmations included).
    runs = [r for r in records if r["status"] != "skip"]
    at_runs = {k: tv(baseline["commit"]) - tv(runs[min(k, len(runs)) - 1]["best"] or baseline["commit"])
               for k in checkpoints}
    return {
        "rule": rule, "keeps": len(keeps), "false": len(false), "worse": len(worse), "at_runs": at_runs,
        "false_rate": len(false) / len(keeps) if keeps else 0.0,
        "gain": tv(baseline["commit"]) - tv(final), "optimum_gain": tv(baseline["commit"]) - 1.0,
        "trials": len({r["trial"] for r in records if r["status"] != "skip"}) - 1,
        "runs": sum(1 for r in records if r["status"] != "skip"),
        "confirms": sum(1 for r in records if r["kind"] == "confirm" and "noise_samples" not in r["extra"]),
        "wall": wall, "stop": proc.stdout.strip().splitlines()[-1],
        "crashes": sum(1 for r in records if r["status"] == "crash"),
        # A portfolio's choices (benchmarks/search.py): trials per member.
        "by_proposer": dict(Counter((r["extra"].get("portfolio") or {}).get("choice", r["proposer"])
                                    for r in records if r["attempt"] == 1 and r["kind"] == "candidate")),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--sigma", type=float, default=0.01)
    ap.add_argument("--nights", type=int, default=10, help="nights per rule, seeds 42, 43, ... (totals are printed)")
    ap.add_argument("--noise-runs", type=int, default=2, help="for the noise rule (strict gets 0, as autoresearch)")
    ap.add_argument("--noise-z", type=float, default=2.0, help="z of the noise rule")
    ap.add_argument("--landscape", choices=[*LANDSCAPES, "both"], default="both",
                    help="both: sparse and dense (the table in docs/noise.md); coupled is benchmarks/search.py's")
    ap.add_argument("--checkpoints", default="20,30,45,60,90",
                    help="also print the true gain after this many runs (a shorter night), comma-separated")
    args = ap.parse_args()
    checkpoints = tuple(int(k) for k in args.checkpoints.split(",") if k)
    landscapes = ["sparse", "dense"] if args.landscape == "both" else [args.landscape]
    work = Path(tempfile.mkdtemp(prefix="autoloop-noise-bench-"))
    try:
        for landscape in landscapes:
            rows = []
            for rule, noise_runs in (("strict", 0), ("noise", args.noise_runs)):
                nights = [night(rule, args.trials, args.sigma, noise_runs, work, 42 + i, landscape, checkpoints,
                                args.noise_z) for i in range(args.nights)]
                total = {k: sum(n[k] for n in nights)
                         for k in ("keeps", "false", "worse", "gain", "trials", "runs", "confirms", "wall")}
                total.update(rule=rule, optimum_gain=nights[0]["optimum_gain"],
                             false_rate=total["false"] / total["keeps"] if total["keeps"] else 0.0,
                             at_runs={k: sum(n["at_runs"][k] for n in nights) / args.nights for k in checkpoints})
                rows.append(total)
            print_table(landscape, rows, args, checkpoints)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(landscape: str, rows: list[dict], args, checkpoints: tuple[int, ...]) -> None:
    print(f"\n{landscape} landscape: sigma {args.sigma}, z {args.noise_z:g}, {args.nights} nights (seeds "
          f"42..{41 + args.nights}) of up to {args.trials} trials, mutate proposer; "
          f"true gain possible per night {rows[0]['optimum_gain']:.4f}")
    at = "".join(f" {'gain@' + str(k):>9}" for k in checkpoints)
    print(f"{'rule':<7} {'keeps':>5} {'false':>5} {'false%':>7} {'worse':>5} {'final gain':>10}{at} {'trials':>6} "
          f"{'runs':>5} {'confirms':>8} {'wall s':>7}")
    for r in rows:
        at = "".join(f" {r['at_runs'][k]:>9.4f}" for k in checkpoints)
        print(f"{r['rule']:<7} {r['keeps']:>5} {r['false']:>5} {100 * r['false_rate']:>6.1f}% {r['worse']:>5} "
              f"{r['gain'] / args.nights:>10.4f}{at} {r['trials']:>6} {r['runs']:>5} {r['confirms']:>8} "
              f"{r['wall']:>7.1f}")


if __name__ == "__main__":
    sys.exit(main())
