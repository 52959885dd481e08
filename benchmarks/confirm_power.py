"""What the keep rule's confirmation count costs and buys: a simulation of the rule itself.

Each simulated candidate has a true gain δ over the best (in units of the run-to-run σ). The
best's value is the mean of m runs of its own (m = 3: the baseline and its two noise samples),
so it is off by N(0, σ²/m); each run of the candidate is off by N(0, σ²). The decisions are
those of the real rule, ``autoloop.core.judge.judge_runs`` at z = 2, fed these numbers:

* ``one re-run``   the rule before the count: a within-noise first run is re-run once and
                   judged on the mean of two;
* ``run all``      the count from --power (core/power.confirm_runs, capped at 1 + 3 runs),
                   every run made, judged once on the mean of all;
* ``shipped``      as ``run all``, but stopped early where the mean so far is no better than
                   the best (the only early stop the rule allows);
* ``keep early``   as ``run all``, but kept at the first interim mean that clears its bar:
                   the early stop the rule does not allow, shown for its false keeps.

It prints, for each δ, the share kept and the runs spent per candidate, then the same over a
night's mix of candidates (most changes do nothing or harm): the false keeps (kept with δ <= 0)
per 1000 candidates, the true keeps, and the runs. σ is known exactly here; a night's σ is
itself estimated from m runs, which this does not model.

    python benchmarks/confirm_power.py                  # 20000 candidates per δ, power 0.8, m 3
    python benchmarks/confirm_power.py --power 0.9 --best-runs 5
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoloop.core.judge import judge_runs
from autoloop.core.power import MAX_CONFIRMATIONS

POLICIES = ("one re-run", "run all", "shipped", "keep early")
GAINS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
# A night's candidates: (true gain in σ, share). Most changes do nothing or harm.
MIX = ((-1.0, 0.3), (-0.5, 0.2), (0.0, 0.2), (0.5, 0.1), (1.0, 0.1), (1.5, 0.05), (2.0, 0.03), (3.0, 0.02))


def one(policy: str, gain: float, rng: random.Random, power: float, m: int) -> tuple[bool, int]:
    """(kept, runs spent) of one candidate with true gain ``gain`` (lower is better)."""
    best = rng.gauss(0.0, 1.0 / m ** 0.5)
    draws = [rng.gauss(-gain, 1.0) for _ in range(1 + MAX_CONFIRMATIONS)]
    kw = dict(noise=1.0, z=2.0, rule="noise")
    first = judge_runs(draws[:1], best, "min", power=None if policy == "one re-run" else power, best_runs=m, **kw)
    if first.status != "confirm":
        return first.status == "keep", 1
    n = first.count.runs if first.count is not None else 2
    if policy in ("one re-run", "run all"):
        return judge_runs(draws[:n], best, "min", can_confirm=False, **kw).status == "keep", n
    for k in range(2, n + 1):
        if policy == "shipped":
            j = judge_runs(draws[:k], best, "min", can_confirm=False, planned=n, **kw)
            if j.status != "confirm":
                return j.status == "keep", k
        else:
            j = judge_runs(draws[:k], best, "min", can_confirm=False, **kw)
            if j.status == "keep" or k == n:
                return j.status == "keep", k
    raise AssertionError("a confirmation past its count")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20000, help="candidates per true gain")
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--best-runs", type=int, default=3, help="the runs the best's value is the mean of")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    table: dict[tuple[str, float], tuple[float, float]] = {}
    print(f"power {a.power}, best = mean of {a.best_runs} runs, z 2, at most {1 + MAX_CONFIRMATIONS} runs, "
          f"{a.draws} candidates per gain")
    print(f"{'gain/σ':>7} " + " ".join(f"{p + ' kept':>17} {'runs':>5}" for p in POLICIES))
    for gain in GAINS:
        row = []
        for policy in POLICIES:
            rng = random.Random(f"{a.seed}:{gain}")   # the same draws for every policy
            results = [one(policy, gain, rng, a.power, a.best_runs) for _ in range(a.draws)]
            kept = sum(k for k, _ in results) / a.draws
            runs = sum(n for _, n in results) / a.draws
            table[policy, gain] = (kept, runs)
            row.append(f"{kept:>17.1%} {runs:>5.2f}")
        print(f"{gain:>7.1f} " + " ".join(row))
    print("\nover a night's mix (" + ", ".join(f"{g:+.1f}σ {s:.0%}" for g, s in MIX) + "), per 1000 candidates:")
    print(f"{'policy':>12} {'false keeps':>12} {'true keeps':>11} {'runs':>7}")
    for policy in POLICIES:
        false = sum(s * table[policy, g][0] for g, s in MIX if g <= 0) * 1000
        true = sum(s * table[policy, g][0] for g, s in MIX if g > 0) * 1000
        runs = sum(s * table[policy, g][1] for g, s in MIX) * 1000
        print(f"{policy:>12} {false:>12.1f} {true:>11.1f} {runs:>7.0f}")


if __name__ == "__main__":
    main()
