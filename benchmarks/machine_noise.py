"""Does adjusting for the machine's speed take the host's jitter out of val_bpb? The real train.py.

Runs the default train.py (side A) ``--runs`` times with one seed and budget, and a truly
faster change (side B: ``--fast`` replaces constants, by default a shallower model) a few
times in between, each through the runner with the machine probe around it exactly as an
attempt does (execution/machine_speed.py). Prints each run (val_bpb, steps, tokens/s, the
probe's figures), then the pooled fit of val_bpb on ln(machine speed) over the repeats
(core/machine_speed.py): the spread of A's runs raw and adjusted, and, for comparison, the
same fit against ln(steps) (which would also remove a real speed-up, so it is no option)
and against each part of the speed alone (the kernel's rate; the share of the machine left).
Then A against B, raw and adjusted: a change that really trains faster must still win.

    python benchmarks/machine_noise.py                           # 10 x 60 s of A, 4 of B
    python benchmarks/machine_noise.py --runs 6 --budget 20 --fast-runs 2 --val-bytes 65536
    python benchmarks/machine_noise.py --json runs.jsonl         # keep every run's figures
    python benchmarks/machine_noise.py --summarize runs.jsonl    # the tables again, from the file

Target: A's adjusted spread at most half its raw spread.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autoloop.core.machine_speed import Run, fit  # noqa: E402
from autoloop.data import CorpusSpec, DataError, default_data_dir, load_data, prepare  # noqa: E402
from autoloop.execution.machine_speed import Probe  # noqa: E402
from autoloop.execution.runner import RunSpec, build_env, run_process  # noqa: E402


def _share(r: dict) -> float | None:
    return max(0.05, 1 - r["others"] - r["steal"]) if "others" in r else None


def _kernel(r: dict) -> float | None:
    return _mean([r.get("probe_before"), r.get("probe_after")])


# Each from the run's recorded parts, so that files written by earlier versions read alike.
COVARIATES = {
    "CPUs left during training: machine_speed, used": _share,
    "kernel rate x share left (the first design)": lambda r: (_kernel(r) or 0) * (_share(r) or 0) or None,
    "kernel rate before/after alone": _kernel,
    "steps (an oracle that would also remove real speed-ups)": lambda r: r.get("steps"),
}
USED = _share


def _mean(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return sum(ys) / len(ys) if ys else None


def variant(text: str, fast: str) -> str:
    for pair in fast.split(","):
        name, value = pair.split("=")
        text, n = re.subn(rf"^{name}\s*=\s*[^#\n]*", f"{name} = {value}  ", text, count=1, flags=re.M)
        if not n:
            sys.exit(f"error: {name} is not a constant of train.py")
    return text


def run_once(side: str, folder: Path, budget: float, seed: int, n: int, data_dir: Path) -> dict:
    result = folder / f"result-{n}.json"
    env = build_env(budget, seed, result, data_dir, "cpu", f"bench{n}") | {"PYTHONPATH": str(REPO)}
    spec = RunSpec(command=[sys.executable, "train.py"], cwd=folder, env=env, log_path=folder / f"{n}.log",
                     result_path=result, budget_s=budget, require_result=True,
                     timeout_s=budget + 1200)   # evaluation on a loaded 2-core host takes minutes
    probe = Probe(device="cpu")
    probe.start()
    out = run_process(spec, on_progress=probe.mark, on_start=probe.watch)
    machine = probe.finish() or {}
    s = out.summary
    row = {"side": side, "n": n, "val_bpb": out.metric, "steps": s.get("num_steps"),
           "tokens_per_sec": s.get("tokens_per_sec"), "wall": round(out.wall_seconds, 1), **machine}
    if out.metric is None:
        row["error"] = out.metric_error or out.log_tail[-300:]
    return row


def fmt(r: dict) -> str:
    if r.get("error"):
        return f"{r['side']} #{r['n']:<3} error: {r['error']!s:.200}"
    return (f"{r['side']} #{r['n']:<3} val_bpb {r['val_bpb']:.4f}  steps {r['steps']:>5.0f}  "
            f"tok/s {r['tokens_per_sec']:>7.0f}  kernel {r.get('probe_before', 0):>9.4g} -> "
            f"{r.get('probe_after', 0):<9.4g} others {r.get('others', 0):.2f} steal {r.get('steal', 0):.3f}  "
            f"speed {r.get('speed', 0):.4g} ({r.get('window', '-')})  wall {r['wall']}")


def summarize(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if not r.get("error")]
    lines = [f"\n{len(ok)} runs ({len(rows) - len(ok)} failed); A = default train.py, B = the faster change"]
    for label, get in COVARIATES.items():
        runs = [Run(r["side"], r["val_bpb"], get(r)) for r in ok]
        f = fit(runs)
        a = [r for r in ok if r["side"] == "A"]
        adj = [f.adjust(r["val_bpb"], get(r)) if f.slope is not None else r["val_bpb"] for r in a]
        forced = _forced(f, runs)
        raw_sd = statistics.stdev([r["val_bpb"] for r in a]) if len(a) > 1 else float("nan")
        adj_sd = statistics.stdev([forced.adjust(r["val_bpb"], get(r)) for r in a]) if len(a) > 1 else float("nan")
        loo = _leave_one_out(runs, [i for i, r in enumerate(ok) if r["side"] == "A"])
        loo_sd = statistics.stdev(loo) if len(loo) > 1 else float("nan")
        lines.append(f"  against ln({label}):")
        lines.append(f"    {f.note}")
        used_here = "used" in label
        if math.isnan(loo_sd):
            # The speed did not vary (an idle or dedicated machine): there is no fit to leave a run
            # out of, and nothing for the adjustment to remove, so the target does not apply.
            target = ": nothing to adjust on this machine; the target applies where its speed varies"
            lines.append(f"    A: stdev raw {raw_sd:.4f}, adjusted {adj_sd:.4f}; no leave-one-out fit "
                         f"(the speed did not vary){target if used_here else ''}")
        else:
            target = f": target <= 0.5 {'met' if loo_sd <= raw_sd / 2 else 'NOT met'}"
            lines.append(f"    A: stdev raw {raw_sd:.4f}, adjusted {adj_sd:.4f} (ratio {adj_sd / raw_sd:.2f}); "
                         f"each run adjusted by the fit of the others {loo_sd:.4f} (ratio {loo_sd / raw_sd:.2f})"
                         f"{target if used_here else ''}")
        del adj
    used = fit([Run(r["side"], r["val_bpb"], USED(r)) for r in ok])
    forced = _forced(used, [])
    lines.append("\n  A against B, adjusted by the CPUs left during training, mean of each side:")
    means = {}
    for side in ("A", "B"):
        rs = [r for r in ok if r["side"] == side]
        if rs:
            raw = statistics.mean(r["val_bpb"] for r in rs)
            adj = statistics.mean(forced.adjust(r["val_bpb"], USED(r)) for r in rs)
            steps = statistics.mean(r["steps"] for r in rs)
            means[side] = (raw, adj)
            lines.append(f"    {side}: {len(rs)} runs, val_bpb raw {raw:.4f}, adjusted {adj:.4f}, steps {steps:.0f}")
    if len(means) == 2:
        (ra, aa), (rb, ab) = means["A"], means["B"]
        lines.append(f"    B better than A by {ra - rb:+.4f} raw, {aa - ab:+.4f} adjusted: "
                     f"{'B still wins' if aa > ab else 'B does not win'} after adjustment")
    return lines


def _leave_one_out(runs: list[Run], which: list[int]) -> list[float]:
    """Each run in ``which`` adjusted by the slope fitted without it (an out-of-sample figure)."""
    out = []
    for i in which:
        f = fit(runs[:i] + runs[i + 1:])
        if f.slope is not None and runs[i].speed:
            out.append(_forced(f, runs).adjust(runs[i].metric, runs[i].speed))
    return out


def _forced(f, runs):   # the fit's slope applied even where it would not be used: to show it
    from dataclasses import replace
    return replace(f, use=f.slope is not None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--fast-runs", type=int, default=4)
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fast", default="DEPTH=2", help="constants of side B (NAME=VALUE,...)")
    p.add_argument("--val-bytes", type=int, help="evaluate on a validation slice of this size, prepared under "
                   "/tmp (a loaded host takes minutes over the default 512 KiB; the metric is then only "
                   "comparable within this benchmark)")
    p.add_argument("--json", type=Path)
    p.add_argument("--summarize", type=Path)
    args = p.parse_args(argv)
    if args.summarize:
        rows = [json.loads(line) for line in args.summarize.read_text().splitlines() if line.strip()]
        print("\n".join(summarize(rows)))
        return 0
    try:
        if args.val_bytes:
            data_dir = Path(tempfile.gettempdir()) / f"autoloop-machine-noise-val{args.val_bytes}"
            prepare(CorpusSpec(val_bytes=args.val_bytes), data_dir)
        else:
            load_data()
            data_dir = default_data_dir()
    except DataError as e:
        sys.exit(f"error: {e}")
    text = (REPO / "train.py").read_text()
    every = max(1, args.runs // max(1, args.fast_runs)) if args.fast_runs else 0
    order = []
    for i in range(args.runs):
        order.append("A")
        if every and i % every == every // 2 and order.count("B") < args.fast_runs:
            order.append("B")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"A": Path(tmp) / "A", "B": Path(tmp) / "B"}
        for side, folder in sides.items():
            folder.mkdir()
            (folder / "train.py").write_text(text if side == "A" else variant(text, args.fast))
        print(f"{len(order)} runs x {args.budget:g} s: {''.join(order)}; load {_load()}", flush=True)
        start = time.time()
        for n, side in enumerate(order, 1):
            r = run_once(side, sides[side], args.budget, args.seed, n, data_dir)
            rows.append(r)
            print(fmt(r) + f"  load {_load()}", flush=True)
            if args.json:
                with args.json.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
        print(f"({time.time() - start:.0f} s)")
    print("\n".join(summarize(rows)))
    return 0


def _load() -> str:
    import os
    return f"{os.getloadavg()[0]:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
