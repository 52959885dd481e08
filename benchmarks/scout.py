"""Does --scout pay? Simulated nights on scripted landscapes, scouting against none, same device time.

Each proposal is an idea with a true effect on the full-budget metric and one on the
scout-budget metric; the two are drawn so that their rank correlation (Spearman) is the
chosen rho (a Gaussian copula: Pearson 2 sin(pi rho / 6)). Good ideas are rare: a share
``--good`` of them improve the metric by 3 to 7 full-rung sigmas, the rest mostly hurt
(a few help a little). A night has ``--hours`` of device time; every run costs its budget
plus ``--overhead`` seconds around the training (start-up, imports, data, evaluation).

The decisions are the engine's own: ``core.keep.decide`` judges every full run (the noise
rule, confirmations) and every scout run (``kind="scout"``: core/scout.py's margin from
the measured scout noise), and ``core.scout.switched_off`` turns scouting off when the
rungs stop agreeing. The night starts as autoloop's does: the baseline and --noise-runs 2
more runs of it, and with scouting two scout runs of it (the rung's noise and reference);
each keep gets fresh scout runs of the new best as its reference (engine/scout.py).

Printed per rho and mode over ``--nights`` nights (the same ideas and draws for both modes):
trials, promoted share, the true gain of the final best over the baseline (in full-rung
sigmas; what a verification would find), that gain per device-hour, false keeps (kept
changes whose true effect is not an improvement), good ideas found, and the nights on
which scouting switched itself off.

    python benchmarks/scout.py                          # rho 0.9 0.6 0.3, 40 nights each
    python benchmarks/scout.py --nights 40 --overhead 25 --rho 0.9
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoloop.core.judge import noise_estimate
from autoloop.core.keep import Facts, Rules, decide
from autoloop.core.scout import ScoutRef, pooled_sigma, switched_off
from autoloop.engine.scout import SAMPLES_AFTER_KEEP

SIGMA = 1.0            # the full rung's run-to-run noise (the unit of every figure)
BASE = 100.0           # the baseline's true full-rung metric (lower is better)
SCOUT_BASE = 130.0     # and at the scout rung (a shorter run ends higher)


@dataclass
class Idea:
    full: float        # true effect on the full-rung metric (negative: better)
    scout: float       # true effect on the scout-rung metric


def effect(u: float, good: float) -> float:
    """A monotone map of a standard normal draw to an effect: the lowest ``good`` share are
    the rare good ideas (3 to 7 sigma better), the rest mostly hurt."""
    cut = statistics.NormalDist().inv_cdf(good)
    if u < cut:
        return -SIGMA * (3 + min(4.0, 2 * (cut - u)))
    return SIGMA * (3 * (u - cut) - 1)


def landscape(rng: random.Random, n: int, rho: float, good: float) -> list[Idea]:
    r = 2 * math.sin(math.pi * rho / 6)    # Pearson for a Spearman of rho
    ideas = []
    for _ in range(n):
        u = rng.gauss(0, 1)
        v = r * u + math.sqrt(1 - r * r) * rng.gauss(0, 1)
        ideas.append(Idea(effect(u, good), effect(v, good)))
    return ideas


@dataclass
class Night:
    scouting: bool
    seconds: float
    budget: float
    scout_budget: float
    overhead: float
    scout_noise: float
    rng: random.Random
    used: float = 0.0
    trials: int = 0
    promoted: int = 0
    scouted: int = 0
    true_best: float = 0.0           # the kept ideas' true full effects, summed
    true_scout: float = 0.0          # and their scout effects
    kept: list[Idea] = field(default_factory=list)
    pairs: list[tuple[float, float]] = field(default_factory=list)
    off_at: int | None = None        # the trial at which scouting switched itself off
    best_runs: int = 3               # the runs the best's value is the mean of (the baseline's 3 first)

    def cost(self, scout: bool) -> float:
        return (self.scout_budget if scout else self.budget) + self.overhead

    def run(self, scout: bool, idea: Idea | None) -> float | None:
        """One run's measured metric, None when the night's device time is spent."""
        if self.used + self.cost(scout) > self.seconds:
            return None
        self.used += self.cost(scout)
        if scout:
            return SCOUT_BASE + self.true_scout + (idea.scout if idea else 0) + self.rng.gauss(0, self.scout_noise)
        return BASE + self.true_best + (idea.full if idea else 0) + self.rng.gauss(0, SIGMA)


RULES = Rules(sanity_bound=0.0)


def full_trial(night: Night, idea: Idea, best: tuple[str, float], noise: float | None, name: str,
               ) -> tuple[tuple[str, float], float | None] | None:
    """The idea at the full budget (a confirmation when asked): the best after, the first
    full result; None when out of time."""
    first = night.run(False, idea)
    if first is None:
        return None
    runs: tuple[float, ...] = (first,)
    count = None   # the confirmation's count from power, as the engine carries it from run to run
    while True:
        d = decide(Facts(kind="candidate", commit=name, runs=runs, parent=best, current=best, noise=noise,
                         can_confirm=len(runs) == 1, rules=RULES, best_runs=night.best_runs, confirmation=count))
        if d.action != "confirm":
            break
        count = count or d.confirmation
        again = night.run(False, idea)
        if again is None:
            return best, first
        runs = (*runs, again)
    if d.status == "keep":
        night.true_best += idea.full
        night.true_scout += idea.scout
        night.kept.append(idea)
        night.best_runs = len(runs)
        assert d.best[1] is not None
        return (name, d.best[1]), first
    return best, first


def simulate(ideas: list[Idea], scouting: bool, args: argparse.Namespace, seed: int) -> Night:
    night = Night(scouting, args.hours * 3600, args.budget, args.scout, args.overhead, args.scout_noise,
                  random.Random(seed))
    base_runs = [night.run(False, None) for _ in range(3)]     # the baseline and 2 noise runs
    noise, _ = noise_estimate([x for x in base_runs if x is not None])
    best: tuple[str, float] = ("base", statistics.mean(x for x in base_runs if x is not None))
    scout_runs: dict[str, list[float]] = {}
    if scouting:
        scout_runs["base"] = [x for x in (night.run(True, None), night.run(True, None)) if x is not None]
    for k, idea in enumerate(ideas):
        name = f"c{k}"
        on = scouting and night.off_at is None
        scouted = None
        if on:
            scouted = night.run(True, idea)
            if scouted is None:
                break
            night.scouted += 1
            ref = ScoutRef(tuple(scout_runs.get(best[0], ())), pooled_sigma(list(scout_runs.values())))
            d = decide(Facts(kind="scout", commit=name, runs=(scouted,), parent=best, current=best, scout=ref,
                             rules=RULES))
            if d.action != "promote":
                night.trials += 1
                continue
            night.promoted += 1
        done = full_trial(night, idea, best, noise, name)
        if done is None:
            break
        night.trials += 1
        best, first = done
        if on and best[0] == name:   # a keep: fresh scout samples of the new best, its reference
            scout_runs[name] = [x for x in (night.run(True, None) for _ in range(SAMPLES_AFTER_KEEP))
                                if x is not None]
        if scouted is not None and first is not None:
            night.pairs.append((scouted, first))
            if switched_off(night.pairs) is not None:
                night.off_at = k
    return night


def summarize(nights: list[Night], good: list[int]) -> dict[str, float]:
    gains = [-n.true_best / SIGMA for n in nights]
    hours = [n.used / 3600 for n in nights]
    return {
        "trials": statistics.mean(n.trials for n in nights),
        "promoted": (sum(n.promoted for n in nights) / max(1, sum(n.scouted for n in nights))
                     if any(n.scouting for n in nights) else float("nan")),
        "gain": statistics.mean(gains), "gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
        "per_hour": sum(gains) / sum(hours),
        "false_keeps": statistics.mean(sum(1 for i in n.kept if i.full >= 0) for n in nights),
        "found": statistics.mean(sum(1 for i in n.kept if i.full <= -3 * SIGMA) for n in nights),
        "offered": statistics.mean(good),
        "off": sum(n.off_at is not None for n in nights),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rho", type=float, nargs="+", default=[0.9, 0.6, 0.3], help="the rungs' rank correlations")
    p.add_argument("--nights", type=int, default=40)
    p.add_argument("--hours", type=float, default=8.0, help="device time per night")
    p.add_argument("--budget", type=float, default=300.0, help="full budget, seconds")
    # A tenth of the budget: where scouting paid in this benchmark (a fifth gave 1.65x at rho 0.9).
    p.add_argument("--scout", type=float, default=30.0, help="scout budget, seconds")
    p.add_argument("--overhead", type=float, default=20.0, help="seconds each run pays around its training")
    p.add_argument("--scout-noise", type=float, default=1.5, help="the scout rung's noise, in full-rung sigmas")
    p.add_argument("--good", type=float, default=0.05, help="share of good ideas")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print(f"{args.nights} nights x {args.hours:g} h per row; budget {args.budget:g} s, scout {args.scout:g} s, "
          f"overhead {args.overhead:g} s per run; scout noise {args.scout_noise:g} sigma; good ideas "
          f"{args.good:.0%}. Gains in full-rung sigmas (true effect of the final best).")
    head = (f"{'rho':>4} {'mode':>6} {'trials':>7} {'promoted':>8} {'gain/night':>13} {'gain/dev-h':>10} "
            f"{'x none':>6} {'false keeps':>11} {'good found':>13} {'off':>4}")
    print(head)
    print("-" * len(head))
    for rho in args.rho:
        rows = {}
        for mode in ("none", "scout"):
            nights, offered = [], []
            for n in range(args.nights):
                rng = random.Random(f"{args.seed}-{rho}-{n}")
                ideas = landscape(rng, 2000, rho, args.good)
                night = simulate(ideas, mode == "scout", args, seed=hash((args.seed, rho, n)) & 0xFFFF)
                nights.append(night)
                offered.append(sum(1 for i in ideas[:max(night.trials, 1)] if i.full <= -3 * SIGMA))
            rows[mode] = summarize(nights, offered)
        for mode, r in rows.items():
            ratio = r["per_hour"] / rows["none"]["per_hour"] if rows["none"]["per_hour"] > 0 else float("nan")
            promoted = "-" if math.isnan(r["promoted"]) else f"{r['promoted']:.0%}"
            print(f"{rho:>4.1f} {mode:>6} {r['trials']:>7.1f} {promoted:>8} {r['gain']:>7.1f} ± {r['gain_sd']:>4.1f} "
                  f"{r['per_hour']:>10.2f} {ratio:>6.2f} {r['false_keeps']:>11.2f} "
                  f"{r['found']:>5.1f} of {r['offered']:>4.1f} {('-' if mode == 'none' else r['off']):>4}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
