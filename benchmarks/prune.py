"""Pruning (--prune) replayed on real train.py curves: device time saved and false prunes.

The curves are real runs of train.py on this machine (benchmarks/data/prune_curves.json,
recorded by benchmarks/record_curves.py: one change each, the baseline repeated among them).
This script replays them through core/prune.py's own rule, the engine's functions:

1. the rank agreement of the early loss with the final val_bpb (Spearman over every run) at
   shares of the budget: how much a look at the curve mid-run says about the end;
2. each rule (warm-up share, band z, with or without the slope projection) over every run,
   held against the baseline's mean curve and the curve noise of its repeats (each baseline
   run held against the others): the runs it prunes, the training time it saves, and its
   false prunes: pruned runs whose final val_bpb beat the baseline's mean (a change that
   would have been a win, or a tie, stopped);
3. simulated nights: trials drawn from the recorded changes (with replacement), each kept if
   its final val_bpb beats the best by the noise rule (2 sigma of the baseline's repeats),
   with and without pruning, the rule turning itself off as in a night (core.prune.rule_off
   over the completed trials' pairs): device time, kept changes and the best at the end.

    python benchmarks/prune.py [--data benchmarks/data/prune_curves.json] [--nights 200]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoloop.core.prune import (  # noqa: E402
    BAND_Z,
    PROJECT,
    WARMUP_SHARE,
    PruneRef,
    Watch,
    curve_noise,
    loss_at,
    mean_curve,
    partial_gap,
    rule_off,
)
from autoloop.core.scout import pooled_sigma, spearman  # noqa: E402

SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
RULES = [(share, z, project) for share in (0.3, 0.5, 0.7) for z in (0.0, 1.0, 2.0, 3.0) for project in (False, True)]


def load(path: Path) -> tuple[dict, list[dict]]:
    data = json.loads(path.read_text())
    runs = [r for r in data["runs"] if r.get("val_bpb") is not None and r.get("curve")]
    for r in runs:
        r["c"] = tuple((float(p[0]), float(p[1])) for p in r["curve"])
        # (step, loss) where the recording kept the step (benchmarks/record_curves.py does
        # since the first real night; the committed recording predates it: time alone)
        r["s"] = tuple(sorted((float(p[2]), float(p[1])) for p in r["curve"] if len(p) == 3))
        r["pts"] = [(float(p[0]), float(p[1]), float(p[2]) if len(p) == 3 else None) for p in r["curve"]]
    return data, runs


def reference(baselines: list[dict], leave_out: dict | None, budget: float) -> PruneRef:
    others = [b for b in baselines if b is not leave_out]
    return PruneRef(mean_curve([b["c"] for b in others]),
                    curve_noise([[b["c"] for b in others]], WARMUP_SHARE * budget), budget)


def replay(run: dict, ref: PruneRef, share: float, z: float, project: bool) -> float | None:
    """Where the rule stops this run (elapsed s), None when it trains to the end."""
    watch = Watch(ref, share, z, project=project)
    for t, v, step in run["pts"]:
        if watch.see(t, v, step):
            return t
    return None


def agreement_table(runs: list[dict], budget: float) -> list[tuple[float, float | None]]:
    out = []
    for share in SHARES:
        pairs = [(v, r["val_bpb"]) for r in runs if (v := loss_at(r["c"], share * budget)) is not None]
        out.append((share, spearman(pairs)))
    return out


def rule_table(runs: list[dict], sigma: float | None, budget: float) -> list[dict]:
    """Every run held against every other as the best (its curve the reference, the curve
    noise of the baseline's repeats): a prune is false when the run's final val_bpb beat the
    reference's; the schedule changes' false prunes are counted apart."""
    rows = []
    for share, z, project in RULES:
        pairs, pruned, saved, false, schedule_false = 0, 0, 0.0, 0, 0
        for best in runs:
            ref = PruneRef(best["c"], sigma, budget, best["s"])
            for r in runs:
                if r is best:
                    continue
                pairs += 1
                at = replay(r, ref, share, z, project)
                if at is None:
                    continue
                pruned += 1
                saved += budget - at
                if r["val_bpb"] < best["val_bpb"]:
                    false += 1
                    schedule_false += r["kind"] == "schedule"
        rows.append({"share": share, "z": z, "project": project, "pairs": pairs, "pruned": pruned,
                     "saved": saved / (budget * pairs), "false": false, "schedule_false": schedule_false})
    return rows


def night(rng: random.Random, runs: list[dict], sigma: float | None, budget: float, sigma_bpb: float,
          trials: int, prune: bool, share: float, z: float, project: bool) -> dict:
    """One simulated night: the best starts as a run drawn from the recorded ones, the trials
    are drawn from the others; a trial is kept when its final val_bpb beats the best by 2
    sigma (the noise rule), and its curve then is the best's."""
    start = rng.choice(runs)
    changes = [r for r in runs if r is not start]
    best_bpb = start["val_bpb"]
    ref = PruneRef(start["c"], sigma, budget, start["s"])
    device, kept, false, pruned, off_at = 0.0, 0, 0, 0, None
    pairs: list[tuple[float, float]] = []
    for i in range(trials):
        r = rng.choice(changes)
        at = replay(r, ref, share, z, project) if prune and off_at is None else None
        win = r["val_bpb"] < best_bpb - 2 * sigma_bpb
        if at is not None:
            device += at
            pruned += 1
            false += win
            continue
        device += budget
        gap = partial_gap(r["c"], ref, share)
        if gap is not None:
            pairs.append((gap, r["val_bpb"] - best_bpb))
            if prune and off_at is None and rule_off(pairs) is not None:
                off_at = i
        if win:
            kept += 1
            best_bpb = r["val_bpb"]
            ref = PruneRef(r["c"], sigma, budget, r["s"])
    return {"device": device, "kept": kept, "false": false, "pruned": pruned, "best": best_bpb, "off": off_at}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data" / "prune_curves.json")
    ap.add_argument("--nights", type=int, default=200)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data, runs = load(args.data)
    budget = float(data["budget_s"])
    baselines = [r for r in runs if r["kind"] == "baseline"]
    sigma_bpb = pooled_sigma([[b["val_bpb"] for b in baselines]]) or 0.0
    sigma_curve = curve_noise([[b["c"] for b in baselines]], WARMUP_SHARE * budget)
    loads = [r["load_before"][0] for r in runs]
    print(f"{len(runs)} real runs of train.py at {budget:g} s ({len(baselines)} of the baseline, "
          f"{sum(r['kind'] == 'schedule' for r in runs)} changes of schedule), recorded {data['started']} .. "
          f"{data.get('finished', '?')}, load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"baseline val_bpb {statistics.fmean(b['val_bpb'] for b in baselines):.4f}, sd {sigma_bpb:.4f} "
          f"over its repeats; curve noise (train loss, from {WARMUP_SHARE:.0%} of the budget) "
          f"{sigma_curve if sigma_curve is None else f'{sigma_curve:.4f}'} nats")
    print("\nrank agreement of the train loss at a share of the budget with the final val_bpb (Spearman, all runs):")
    for share, rho in agreement_table(runs, budget):
        print(f"  {share:.0%}: {'-' if rho is None else f'{rho:.2f}'}")
    print("\nschedule changes: gap to the baseline's mean curve at shares of the budget (nats), final val_bpb:")
    ref = reference(baselines, None, budget)
    for r in runs:
        if r["kind"] == "schedule":
            gaps = " ".join(f"{(loss_at(r['c'], s * budget) or 0) - (loss_at(ref.curve, s * budget) or 0):+.3f}"
                            for s in SHARES)
            print(f"  {r['description']:28s} {gaps}  val_bpb {r['val_bpb']:.4f}")
    print("\nrules, every run held against every other as the best (false: pruned, yet its final val_bpb beat "
          "the best's):")
    print("  share     z  project   pairs  pruned  training saved  false prunes  of them schedule changes")
    for row in rule_table(runs, sigma_curve, budget):
        default = " (default)" if (row["share"], row["z"], row["project"]) == (WARMUP_SHARE, BAND_Z, PROJECT) else ""
        print(f"  {row['share']:5.0%}  {row['z']:4g}  {str(row['project']):7s}  {row['pairs']:6d}  {row['pruned']:6d}  "
              f"{row['saved']:13.1%}  {row['false']:5d} ({row['false'] / max(1, row['pruned']):4.1%})  "
              f"{row['schedule_false']:5d}{default}")
    print(f"\nsimulated nights ({args.nights} x {args.trials} trials drawn from the {len(runs)} recorded runs, the "
          "first best one of them; keep: 2 sigma better than the best), default rule:")
    for prune in (False, True):
        rng = random.Random(args.seed)
        nights = [night(rng, runs, sigma_curve, budget, sigma_bpb, args.trials, prune, WARMUP_SHARE, BAND_Z,
                        PROJECT) for _ in range(args.nights)]
        dev = statistics.fmean(n["device"] for n in nights) / (args.trials * budget)
        offs = sum(n["off"] is not None for n in nights)
        print(f"  {'--prune' if prune else 'no pruning':10s}  device time {dev:6.1%} of the trials' budgets, "
              f"pruned {statistics.fmean(n['pruned'] for n in nights):4.1f}, false prunes "
              f"{statistics.fmean(n['false'] for n in nights):4.2f}, "
              f"kept {statistics.fmean(n['kept'] for n in nights):4.2f}"
              f", best {statistics.fmean(n['best'] for n in nights):.4f}; rule turned off on {offs} nights")


if __name__ == "__main__":
    main()
