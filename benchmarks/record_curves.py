"""Record real train.py loss curves for benchmarks/prune.py to replay.

Each run is train.py with one change (the mutator's kind of move, or a change of schedule:
a longer warmup, a later or earlier decay), trained for a short budget on this machine, its
progress lines (elapsed training seconds, smoothed train loss, step) and final val_bpb kept. The
baseline runs several times, spread over the recording, so its repeats give the noise band
and show drift in the machine's speed. Written after every run, so a cut recording keeps
what it has.

    python benchmarks/record_curves.py --budget 40 --out benchmarks/data/prune_curves.json

The progress lines come every LOG_EVERY_S seconds; the recording sets it to 1 s in its
copy of train.py (a setting the mutator never moves: it has no effect on val_bpb) so that
the curves have a point a second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoloop.observe.console import parse_progress  # noqa: E402
from autoloop.proposers.mutate import apply_move, constant_moves, find_constants, make_move  # noqa: E402

# (constant, index of the mutator's move list) for the mutator's kind of changes: its first
# moves of the constants a night moves most, both directions where it has them.
MUTATOR_MOVES = [
    ("MATRIX_LR", 0), ("MATRIX_LR", 1), ("MATRIX_LR", 2), ("MATRIX_LR", 3),
    ("EMBED_LR", 0), ("EMBED_LR", 1), ("HEAD_LR", 0), ("HEAD_LR", 1),
    ("SCALAR_LR", 1), ("MUON_MOMENTUM", 0), ("MUON_MOMENTUM", 1),
    ("WEIGHT_DECAY", 0), ("GRAD_CLIP", 1), ("LOGIT_SOFTCAP", 1),
    ("WIDTH", 0), ("WIDTH", 1), ("DEPTH", 0), ("DEPTH", 1), ("BATCH_SIZE", 0), ("BATCH_SIZE", 1),
    ("SEQ_LEN", 1), ("CONV_TAPS", 1), ("MLP_RATIO", 1), ("BIGRAM_EMBED", 0), ("VALUE_EMBEDS", 0),
]
# Changes of schedule: behind mid-run by construction (a longer warmup climbs later, a later
# decay keeps the learning rate, and the loss, high longer), the kind a pruner must not stop.
SCHEDULE_MOVES = [
    ("WARMUP_FRAC", 0.1), ("WARMUP_FRAC", 0.25), ("WARMDOWN_FRAC", 0.3), ("WARMDOWN_FRAC", 0.2),
    ("WARMDOWN_FRAC", 0.8), ("FINAL_LR_FRAC", 0.1),
]
BASELINE_EVERY = 8   # a baseline run before every 8th change (and one at the end)


def changes(source: bytes) -> list[tuple[str, str, bytes]]:
    """(kind, description, source) of every run, baselines spread among them."""
    constants = {c.name: c for c in find_constants(source)}
    mutator: list[tuple[str, str, bytes]] = []
    for name, i in MUTATOR_MOVES:
        moves = constant_moves(constants[name])
        if i < len(moves):
            mutator.append(("mutator", moves[i].description, apply_move(source, moves[i])))
    schedule = []
    for name, value in SCHEDULE_MOVES:
        move = make_move(constants[name], 0, value)
        schedule.append(("schedule", move.description, apply_move(source, move)))
    # The schedule changes spread among the others, so that a change of the machine's load
    # over the recording does not fall on one kind alone.
    out: list[tuple[str, str, bytes]] = []
    step = max(1, len(mutator) // len(schedule))
    for i, change in enumerate(mutator):
        if i % step == 1 and schedule:
            out.append(schedule.pop(0))
        out.append(change)
    out.extend(schedule)
    runs: list[tuple[str, str, bytes]] = []
    for i, change in enumerate(out):
        if i % BASELINE_EVERY == 0:
            runs.append(("baseline", "baseline", source))
        runs.append(change)
    runs.append(("baseline", "baseline", source))
    return runs


def dense_log(source: bytes) -> bytes:
    # The mutator's reader skips LOG_EVERY_S (it never moves it), so a plain rewrite of its line.
    line = next(x for x in source.splitlines(keepends=True) if x.startswith(b"LOG_EVERY_S = "))
    return source.replace(line, b"LOG_EVERY_S = 1.0\n", 1)


def run_one(source: bytes, budget: float, seed: int, workdir: Path) -> dict[str, object]:
    target = workdir / "train.py"
    target.write_bytes(dense_log(source))
    env = {**os.environ, "AUTOLOOP_BUDGET_S": str(budget), "AUTOLOOP_SEED": str(seed),
           "PYTHONPATH": str(ROOT), "AUTOLOOP_PROFILE": "cpu"}
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(target)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=budget * 6 + 300)
    wall = time.monotonic() - t0
    curve: list[list[float]] = []
    val_bpb = None
    for line in proc.stdout.splitlines():
        p = parse_progress(line)
        if "percent" in p and "loss" in p:
            curve.append([round(p["percent"] / 100 * budget, 2), p["loss"], *([p["step"]] if "step" in p else [])])
        if line.startswith("val_bpb:"):
            val_bpb = float(line.split()[1])
    return {"curve": curve, "val_bpb": val_bpb, "exit_code": proc.returncode, "wall_s": round(wall, 1),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "tail": proc.stdout.splitlines()[-3:] if proc.returncode else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=40.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "prune_curves.json")
    ap.add_argument("--limit", type=int, default=0, help="at most this many runs (0: all)")
    args = ap.parse_args()
    source = (ROOT / "train.py").read_bytes()
    runs = changes(source)[: args.limit or None]
    data: dict[str, object] = {
        "how": f"python benchmarks/record_curves.py --budget {args.budget:g}: real train.py runs (cpu "
               "profile), one change each, seed 42 (the baseline's repeats seeds 42, 43, ...), progress "
               "lines every 1 s; curve = [elapsed training seconds, smoothed train loss, step]",
        "machine": f"{os.cpu_count()} cores, shared with other sessions' tests (load averages per run)",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "budget_s": args.budget, "runs": [],
    }
    out_runs: list[dict[str, object]] = data["runs"]  # type: ignore[assignment]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    baselines = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, description, src) in enumerate(runs):
            seed = 42 + baselines if kind == "baseline" else 42
            baselines += kind == "baseline"
            result = run_one(src, args.budget, seed, Path(tmp))
            out_runs.append({"kind": kind, "description": description, "seed": seed, **result})
            data["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            args.out.write_text(json.dumps(data, indent=1) + "\n")
            print(f"{i + 1}/{len(runs)} {description}: val_bpb {result['val_bpb']} wall {result['wall_s']} s "
                  f"load {result['load_before'][0]}", flush=True)


if __name__ == "__main__":
    main()
