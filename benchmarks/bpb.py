"""How good is the default train.py? val_bpb against classic compressors on the same bytes.

Trains the default train.py for each budget on the default corpus (stdlib) and prints
val_bpb beside the bits per byte that gzip -9, bz2 -9 and xz -9e reach on exactly the
validation bytes that val_bpb is measured on, plus steps, tokens/s and peak memory.

    python benchmarks/bpb.py                 # budgets 60 s and 300 s
    python benchmarks/bpb.py --budgets 30    # a quick look
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autoloop.data import load_data  # noqa: E402


def compressor_bpb(data: bytes) -> dict[str, float]:
    n = len(data)
    return {
        "gzip -9": 8 * len(gzip.compress(data, 9)) / n,
        "bz2 -9": 8 * len(bz2.compress(data, 9)) / n,
        "xz -9e": 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / n,
    }


def run_train(budget: float, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        env = {**os.environ, "AUTOLOOP_BUDGET_S": str(budget), "AUTOLOOP_RESULT": str(result),
               "AUTOLOOP_SEED": str(seed)}
        t0 = time.time()
        proc = subprocess.run([sys.executable, "train.py"], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"train.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        summary = {k: float(v) for k, v in re.findall(r"^(\w+):\s+([-\d.]+)$", proc.stdout, re.M)}
        summary["eval_seconds"] = json.loads(result.read_text())["eval_seconds"]
        summary["wall"] = time.time() - t0
        return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[60, 300], help="training budgets in seconds")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    dataset = load_data()
    val = bytes(dataset.split("val"))
    print(f"corpus: {dataset.meta['source']} (fingerprint {dataset.fingerprint}), "
          f"validation {len(val):,} bytes, train {dataset.meta['splits']['train']['bytes']:,} bytes")
    baselines = compressor_bpb(val)
    for name, bpb in baselines.items():
        print(f"  {name:<8} {bpb:.4f} bpb")
    xz = baselines["xz -9e"]
    print()
    print(f"{'budget':>7} {'val_bpb':>8} {'/xz':>6} {'steps':>6} {'tok/s':>8} {'peak MB':>8} {'eval s':>7} {'wall s':>7}")
    for budget in args.budgets:
        s = run_train(budget, args.seed)
        tok_s = s["total_tokens_M"] * 1e6 / max(s["training_seconds"], 1e-9)
        print(f"{budget:>6.0f}s {s['val_bpb']:>8.4f} {s['val_bpb'] / xz:>6.3f} {s['num_steps']:>6.0f} "
              f"{tok_s:>8,.0f} {s['peak_vram_mb']:>8.0f} {s['eval_seconds']:>7.1f} {s['wall']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
