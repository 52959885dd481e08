"""Does train.py on N ranks train the same model as on one, step for step?

    python benchmarks/ddp_equivalence.py [--steps 60] [--seeds 3] [--ranks 2] [--device cpu]

For each seed, trains this checkout's train.py for the same number of steps
(AUTOLOOP_MAX_STEPS: the schedules then follow the step count, not the clock) once as a plain
process and once over N ranks through torch.distributed.run, at the same global batch
(BATCH_SIZE is the batch of all ranks together). Prints val_bpb of every run, the spread
over seeds on one rank, and the 1-rank vs N-rank difference per seed: equivalent when the
differences are far inside the seed spread (they differ only in the order of float sums).
On the CPU the ranks talk over gloo; with --device cuda, NCCL.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train(ranks: int, seed: int, steps: int, device: str, data_dir: Path) -> tuple[float, float]:
    """(val_bpb, wall seconds) of one run."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    env = {**os.environ, "AUTOLOOP_MAX_STEPS": str(steps), "AUTOLOOP_SEED": str(seed), "AUTOLOOP_DEVICE": device,
           "AUTOLOOP_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("AUTOLOOP_RESULT", None)
    t0 = time.time()
    proc = subprocess.run([sys.executable, *launcher, "train.py"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=3600)
    found = re.search(r"^val_bpb:\s+([\d.]+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not found:
        tail = (proc.stdout + proc.stderr)[-3000:]
        sys.exit(f"ddp_equivalence: {ranks}-rank run of seed {seed} failed:\n{tail}")
    return float(found.group(1)), time.time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from autoloop.data import CorpusSpec, prepare

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        # A 64 KiB validation slice keeps each evaluation to seconds on a CPU.
        prepare(CorpusSpec(val_bytes=64 * 1024, audit_bytes=4096), data_dir)
        print(f"train.py, {args.steps} steps, the same global batch; 1 rank vs {args.ranks} ranks on {args.device}")
        print(f"{'seed':>4}  {'1 rank':>10}  {f'{args.ranks} ranks':>10}  {'difference':>10}  seconds (1 / N)")
        one, many = [], []
        for seed in range(1, args.seeds + 1):
            a, ta = train(1, seed, args.steps, args.device, data_dir)
            b, tb = train(args.ranks, seed, args.steps, args.device, data_dir)
            one.append(a)
            many.append(b)
            print(f"{seed:>4}  {a:>10.6f}  {b:>10.6f}  {b - a:>+10.6f}  {ta:.0f} / {tb:.0f}", flush=True)
    spread = statistics.stdev(one) if len(one) > 1 else float("nan")
    worst = max(abs(b - a) for a, b in zip(one, many, strict=True))
    print(f"mean: 1 rank {statistics.mean(one):.6f}, {args.ranks} ranks {statistics.mean(many):.6f}")
    in_sd = f" ({worst / spread:.3f} sd)" if spread > 0 else ""   # nan > 0 is False: one seed
    print(f"seed spread (sd over seeds, 1 rank): {spread:.6f}; largest 1-vs-{args.ranks} difference: "
          f"{worst:.6f}{in_sd}")


if __name__ == "__main__":
    main()
