"""How good is the default train.py? val_bpb against other train.py files and classic compressors.

Trains the default train.py (side A) and each ``--vs`` train.py (B, C, ...) for every
budget and seed, interleaved (A, B, C, A, B, C, ...) so that a change of machine load
during the run hits every side alike, all on the same prepared bytes (the fingerprint of
every run is checked). Prints each run as it finishes (val_bpb, steps, tokens/s), then per
budget and side the mean, sample standard deviation and range of val_bpb over the seeds,
the mean steps, the ratio of each side's mean to A's, and the bits per byte that gzip -9,
bz2 -9 and xz -9e reach on exactly the validation bytes val_bpb is measured on. With 3 or
more seeds it also fits val_bpb against ln(steps) per side: how much a run that did 10 %
more steps gained (a shared machine gives some seeds fewer steps), and the spread the
steps do not explain (the seed itself).

    python benchmarks/bpb.py                                   # A alone, budgets 60 s and 300 s
    python benchmarks/bpb.py --budgets 30                      # a quick look
    python benchmarks/bpb.py --vs old.py port.py --seeds 4 --budgets 60 300
    python benchmarks/bpb.py --summarize runs.jsonl            # the tables of an earlier --json runs.jsonl
    python benchmarks/bpb.py --summarize day1.jsonl day2.jsonl # and the seed spread pooled over both

Every run gets AUTOLOOP_BUDGET_S, AUTOLOOP_SEED, AUTOLOOP_DATA_DIR and AUTOLOOP_RESULT, and
imports the harness of this checkout. Timing on a shared machine moves with the load:
compare sides of one invocation, never figures of two.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autoloop.data import DataError, default_data_dir, load_data  # noqa: E402


@dataclass
class Side:
    letter: str
    path: Path
    runs: dict[float, list[dict]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.letter} {self.path.name}"


def compressor_bpb(data: bytes) -> dict[str, float]:
    n = len(data)
    return {
        "gzip -9": 8 * len(gzip.compress(data, 9)) / n,
        "bz2 -9": 8 * len(bz2.compress(data, 9)) / n,
        "xz -9e": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / n,
    }


def run_train(script: Path, budget: float, seed: int, data_dir: Path, device: str | None) -> dict:
    """One training run; the summary block as numbers, or {'error': one line} when it failed."""
    with tempfile.TemporaryDirectory(prefix="autoloop-bpb-") as tmp:
        result = Path(tmp) / "result.json"
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "AUTOLOOP_BUDGET_S": f"{budget:g}", "AUTOLOOP_RESULT": str(result),
               "AUTOLOOP_SEED": str(seed), "AUTOLOOP_DATA_DIR": str(data_dir), "PYTHONPATH": pythonpath}
        if device:
            env["AUTOLOOP_DEVICE"] = device
        t0 = time.time()
        proc = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env,
                              capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0 or not result.exists():
            failed = re.findall(r"^FAIL: .*$", proc.stdout, re.M)
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
            return {"error": failed[-1] if failed else f"exit {proc.returncode}: {last[:200]}", "wall": wall}
        summary = {k: float(v) for k, v in re.findall(r"^(\w+):\s+([-\d.]+)$", proc.stdout, re.M)}
        record = json.loads(result.read_text())
        summary.update(eval_seconds=record["eval_seconds"], fingerprint=record["fingerprint"], wall=wall)
        return summary


def fmt_run(side: Side, budget: float, seed: int, s: dict, xz: float) -> str:
    head = f"{budget:>6.0f}s  {side.label:<28} {seed:>5}"
    if "error" in s:
        return f"{head}  FAILED  {s['error']}  (wall {s['wall']:.0f} s)"
    tok_s = s["total_tokens_M"] * 1e6 / max(s["training_seconds"], 1e-9)
    return (f"{head} {s['val_bpb']:>8.4f} {s['val_bpb'] / xz:>6.3f} {s['num_steps']:>6.0f} {tok_s:>8,.0f} "
            f"{s['peak_vram_mb']:>8.0f} {s['eval_seconds']:>7.1f} {s['wall']:>7.1f}")


def summary_table(sides: list[Side], budget: float, xz: float) -> list[str]:
    """Per side: mean, sd and range of val_bpb over the seeds, mean steps, and the ratios to A."""
    lines = [f"budget {budget:g} s", f"  {'side':<28} {'runs':>4} {'mean':>8} {'sd':>7} {'min':>8} {'max':>8} "
             f"{'range':>7} {'/xz':>6} {'steps':>7} {'mean/A':>7} {'sd/A':>6}"]
    stats = []
    for side in sides:
        values = [r["val_bpb"] for r in side.runs.get(budget, []) if "error" not in r]
        steps = [r["num_steps"] for r in side.runs.get(budget, []) if "error" not in r]
        if not values:
            lines.append(f"  {side.label:<28}    0  (no run finished)")
            stats.append(None)
            continue
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        stats.append((mean, sd))
        base = stats[0]
        ratio = f"{mean / base[0]:>7.3f}" if base else f"{'-':>7}"
        sd_ratio = f"{sd / base[1]:>6.2f}" if base and base[1] > 0 and sd == sd else f"{'-':>6}"
        lines.append(f"  {side.label:<28} {len(values):>4} {mean:>8.4f} {sd:>7.4f} {min(values):>8.4f} "
                     f"{max(values):>8.4f} {max(values) - min(values):>7.4f} {mean / xz:>6.3f} "
                     f"{statistics.fmean(steps):>7.0f} {ratio} {sd_ratio}")
    if stats[0]:
        for side, st in zip(sides[1:], stats[1:], strict=True):
            if st:
                lines.append(f"  A / {side.letter}: mean ratio {stats[0][0] / st[0]:.3f}"
                             + (f", sd ratio {stats[0][1] / st[1]:.2f}" if st[1] > 0 and st[1] == st[1]
                                and stats[0][1] == stats[0][1] else ""))
    return lines


# A slope fitted over steps that differ by less than this factor is mostly the seed's noise.
MIN_STEPS_SPREAD = 1.08


def steps_fit(values: list[float], steps: list[float]) -> tuple[float, float] | None:
    """val_bpb against ln(steps) within one side: (change per 10 % more steps, sd of what the
    steps do not explain), or None below 3 runs or when every run did the same steps.

    A shared machine runs some seeds faster than others, and a run that did fewer steps ends
    worse; the slope says how much a side suffers from that, the residual sd how much of its
    spread is the seed itself. With n runs the residual has n - 2 degrees of freedom: rough."""
    if len(values) < 3:
        return None
    xs = [math.log(n) for n in steps]
    mx, my = statistics.fmean(xs), statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, values, strict=True))
    return slope * math.log(1.1), math.sqrt(residual / (len(values) - 2))


def steps_table(sides: list[Side], budget: float) -> list[str]:
    """Per side: the spread of steps done, how val_bpb moved with them, and the spread left."""
    lines = ["  how val_bpb moved with the steps done (least squares on ln steps, per side):",
             f"  {'side':<28} {'steps min-max':>14} {'per +10% steps':>15} {'sd | steps':>11}"]
    for side in sides:
        ok = [r for r in side.runs.get(budget, []) if "error" not in r]
        steps = [r["num_steps"] for r in ok]
        fit = steps_fit([r["val_bpb"] for r in ok], steps)
        if fit is None:
            continue
        if max(steps) < MIN_STEPS_SPREAD * min(steps):
            lines.append(f"  {side.label:<28} {f'{min(steps):.0f}-{max(steps):.0f}':>14}  steps too alike to fit")
            continue
        lines.append(f"  {side.label:<28} {f'{min(steps):.0f}-{max(steps):.0f}':>14} {fit[0]:>+15.4f} {fit[1]:>11.4f}")
    return lines if len(lines) > 2 else []


def read_runs(path: Path) -> list[Side]:
    """The sides of an earlier invocation, from the JSON lines its --json wrote."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"error: cannot read {path}: {e}")
    sides: dict[str, Side] = {}
    for row in rows:
        try:
            side = sides.setdefault(row["side"], Side(row["side"], Path(row["path"])))
            side.runs.setdefault(float(row["budget"]), []).append(row)
        except (KeyError, TypeError, ValueError):
            sys.exit(f"error: {path} is not a file that bpb.py --json wrote")
    return [sides[k] for k in sorted(sides)]


@dataclass
class Pool:
    """One side's spread summed over invocations: squares about each file's own mean."""
    label: str
    files: int = 0
    df: int = 0              # sum of n - 1
    squares: float = 0.0
    steps_df: int = 0        # sum of n - 2, over the files whose steps spread enough to fit
    steps_squares: float = 0.0


def pooled_table(invocations: list[list[Side]], budget: float) -> list[str]:
    """Per side over several invocations: the seed spread pooled within each one.

    Each invocation's own mean is set aside (the machine's speed moves between days, and so
    does every side's mean with it); what is left is how far seeds of one side fall apart
    under like conditions, on sum(n - 1) degrees of freedom instead of one file's n - 1.
    The spread the steps do not explain is pooled the same way, on sum(n - 2). Sides are
    matched by letter and file name, so another file under the same letter is not pooled in."""
    pools: dict[str, Pool] = {}
    for sides in invocations:
        for side in sides:
            ok = [r for r in side.runs.get(budget, []) if "error" not in r]
            if len(ok) < 2:
                continue
            values, steps = [r["val_bpb"] for r in ok], [r["num_steps"] for r in ok]
            pool = pools.setdefault(side.label, Pool(side.label))
            pool.files += 1
            pool.df += len(ok) - 1
            pool.squares += statistics.variance(values) * (len(ok) - 1)
            fit = steps_fit(values, steps)
            if fit is not None and max(steps) >= MIN_STEPS_SPREAD * min(steps):
                pool.steps_df += len(ok) - 2
                pool.steps_squares += fit[1] ** 2 * (len(ok) - 2)
    if not pools:
        return []
    lines = [f"budget {budget:g} s, pooled over {len(invocations)} files (each file's mean set aside)",
             f"  {'side':<28} {'files':>5} {'sd':>7} {'df':>3} {'sd | steps':>11} {'df':>3}"]
    sds = {}
    for label in sorted(pools):
        pool = pools[label]
        sds[label] = math.sqrt(pool.squares / pool.df)
        resid = (f"{math.sqrt(pool.steps_squares / pool.steps_df):>11.4f} {pool.steps_df:>3}" if pool.steps_df
                 else f"{'-':>11} {'-':>3}")
        lines.append(f"  {label:<28} {pool.files:>5} {sds[label]:>7.4f} {pool.df:>3} {resid}")
    first = next((label for label in sorted(sds) if label.startswith("A ")), None)
    if first and sds[first] > 0:
        for label in sorted(sds):
            if label != first and sds[label] > 0:
                lines.append(f"  {first} / {label}: pooled sd ratio {sds[first] / sds[label]:.2f}")
    return lines


def summarize(paths: list[Path]) -> int:
    """The summary tables of earlier runs, from the JSON lines their --json wrote; with
    several files, each file's tables and then the spread pooled over them."""
    invocations = [read_runs(path) for path in paths]
    try:
        dataset = load_data()
    except DataError as e:
        sys.exit(f"error: {e}")
    for path, sides in zip(paths, invocations, strict=True):
        if any(r.get("fingerprint", dataset.fingerprint) != dataset.fingerprint
               for side in sides for runs in side.runs.values() for r in runs):
            sys.exit(f"error: {path} holds runs on other data than the prepared {dataset.fingerprint}")
    xz = compressor_bpb(bytes(dataset.split("val")))["xz -9e"]
    for path, sides in zip(paths, invocations, strict=True):
        if len(paths) > 1:
            print(f"== {path}")
        for budget in sorted({b for side in sides for b in side.runs}):
            for line in summary_table(sides, budget, xz) + steps_table(sides, budget):
                print(line)
            print()
    if len(paths) > 1:
        for budget in sorted({b for sides in invocations for side in sides for b in side.runs}):
            for line in pooled_table(invocations, budget):
                print(line)
            print()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs", type=Path, nargs="+", default=[], metavar="PATH",
                        help="other train.py files to train beside the default, interleaved with it")
    parser.add_argument("--train", type=Path, default=REPO / "train.py", metavar="PATH",
                        help="side A (default: this checkout's train.py)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[60, 300], metavar="S",
                        help="training budgets in seconds (default: 60 300)")
    parser.add_argument("--seeds", type=int, default=1, metavar="K", help="seeds per side and budget (default 1)")
    parser.add_argument("--seed", type=int, default=42, help="first seed; the others follow it (default 42)")
    parser.add_argument("--device", help="AUTOLOOP_DEVICE for every run (default: each train.py detects one)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also append every run to FILE as JSON lines")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="FILE",
                        help="train nothing: print the summary tables of the runs earlier --json FILEs hold; "
                             "with several, also each side's seed spread pooled over them")
    args = parser.parse_args(argv)
    if args.summarize:
        return args
    for path in [args.train, *args.vs]:
        if not path.is_file():
            parser.error(f"no such file: {path}")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if any(b <= 0 for b in args.budgets):
        parser.error("every budget must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    sides = [Side(chr(ord("A") + i), path.resolve()) for i, path in enumerate([args.train, *args.vs])]
    seeds = [args.seed + i for i in range(args.seeds)]
    try:
        dataset = load_data()
    except DataError as e:
        sys.exit(f"error: {e}")
    data_dir = Path(os.environ.get("AUTOLOOP_DATA_DIR") or default_data_dir())
    val = bytes(dataset.split("val"))
    print(f"corpus: {dataset.meta['source']} (fingerprint {dataset.fingerprint}), "
          f"validation {len(val):,} bytes, train {dataset.meta['splits']['train']['bytes']:,} bytes")
    baselines = compressor_bpb(val)
    for name, bpb in baselines.items():
        print(f"  {name:<8} {bpb:.4f} bpb")
    xz = baselines["xz -9e"]
    for side in sides:
        print(f"side {side.letter}: {side.path}")
    total = len(args.budgets) * len(seeds) * len(sides)
    print(f"{total} runs, interleaved by seed: {', '.join(s.letter for s in sides)}, "
          f"{', '.join(s.letter for s in sides)}, ...; uptime: {os.getloadavg()[0]:.2f} load\n", flush=True)
    print(f"{'budget':>7}  {'side':<28} {'seed':>5} {'val_bpb':>8} {'/xz':>6} {'steps':>6} {'tok/s':>8} "
          f"{'peak MB':>8} {'eval s':>7} {'wall s':>7}", flush=True)
    failures = 0
    for budget in args.budgets:
        for seed in seeds:
            for side in sides:
                s = run_train(side.path, budget, seed, data_dir, args.device)
                if "error" not in s and s["fingerprint"] != dataset.fingerprint:
                    s = {"error": f"trained on other data (fingerprint {s['fingerprint']})", "wall": s["wall"]}
                failures += "error" in s
                side.runs.setdefault(budget, []).append(s)
                print(fmt_run(side, budget, seed, s, xz), flush=True)
                if args.json:
                    with args.json.open("a") as f:
                        f.write(json.dumps({"side": side.letter, "path": str(side.path), "budget": budget,
                                            "seed": seed, **s}) + "\n")
        print()
        for line in summary_table(sides, budget, xz) + steps_table(sides, budget):
            print(line)
        print(flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if failures:
        print(f"{failures} run(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
